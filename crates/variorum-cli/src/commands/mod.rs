//! One module per subcommand that has no module of its own at the crate root: its clap arguments
//! (`<Name>Args`) and its `run`.

pub mod bench;
pub mod collaborate;
pub mod decision;
pub mod export;
pub mod generate;
pub mod import;
pub mod inspect;
pub mod pattern;
pub mod prepare;
pub mod report;
pub mod runs;
pub mod score;
pub mod train;
pub mod zoo;

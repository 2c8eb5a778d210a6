use std::path::PathBuf;

/// What can go wrong reading or writing a datastore; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum RetrievalError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
    #[error("{}: the vector index failed: {message}", path.display())]
    Index { path: PathBuf, message: String },
}

impl RetrievalError {
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }

    pub fn invalid(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self::Invalid { path: path.into(), message: message.into() }
    }

    pub fn index(path: impl Into<PathBuf>, e: impl std::fmt::Display) -> Self {
        Self::Index { path: path.into(), message: e.to_string() }
    }
}

pub type Result<T> = std::result::Result<T, RetrievalError>;

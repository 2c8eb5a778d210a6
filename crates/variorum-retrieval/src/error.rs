use std::path::PathBuf;

/// What can go wrong reading or writing a datastore; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum RetrievalError {
    /// A file or directory could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file or directory is not what it should be: damaged, of another format or origin, absent.
    #[error("{}: {message}", path.display())]
    Invalid {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong with it, and what to do.
        message: String,
    },
    /// The vector index library (usearch) failed.
    #[error("{}: the vector index failed: {message}", path.display())]
    Index {
        /// The index file.
        path: PathBuf,
        /// The library's error.
        message: String,
    },
}

impl RetrievalError {
    /// For `map_err`: turns an I/O error on `path` into [`RetrievalError::Io`].
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }

    /// [`RetrievalError::Invalid`] about `path`.
    pub fn invalid(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self::Invalid { path: path.into(), message: message.into() }
    }

    /// [`RetrievalError::Index`] about `path`, from the index library's error `e`.
    pub fn index(path: impl Into<PathBuf>, e: impl std::fmt::Display) -> Self {
        Self::Index { path: path.into(), message: e.to_string() }
    }
}

/// This crate's result: [`RetrievalError`] on failure.
pub type Result<T> = std::result::Result<T, RetrievalError>;

//! The crate's error: what was being done and why it failed, or a refusal in one line.

use std::fmt::Display;

/// Everything that can go wrong in the report crate.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// What was being done (`cannot write runs/a/metrics.jsonl`), caused by `source` (the
    /// operating system's error, a JSON error, ...).
    #[error("{what}")]
    Context {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A refusal in one line: an argument, or a file that does not hold what it should.
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

pub type Result<T, E = ReportError> = std::result::Result<T, E>;

/// Says what was being done when an error happened, as anyhow's `Context` does, into a
/// [`ReportError::Context`] (on an error) or a [`ReportError::Invalid`] (on `None`).
pub trait Context<T> {
    fn context<C: Display>(self, what: C) -> Result<T>;
    fn with_context<C: Display, F: FnOnce() -> C>(self, what: F) -> Result<T>;
}

impl<T, E: std::error::Error + Send + Sync + 'static> Context<T> for std::result::Result<T, E> {
    fn context<C: Display>(self, what: C) -> Result<T> {
        self.map_err(|e| ReportError::Context {
            what: what.to_string(),
            source: Box::new(e),
        })
    }

    fn with_context<C: Display, F: FnOnce() -> C>(self, what: F) -> Result<T> {
        self.map_err(|e| ReportError::Context {
            what: what().to_string(),
            source: Box::new(e),
        })
    }
}

impl<T> Context<T> for Option<T> {
    fn context<C: Display>(self, what: C) -> Result<T> {
        self.ok_or_else(|| ReportError::Invalid(what.to_string()))
    }

    fn with_context<C: Display, F: FnOnce() -> C>(self, what: F) -> Result<T> {
        self.ok_or_else(|| ReportError::Invalid(what().to_string()))
    }
}

/// Returns a [`ReportError::Invalid`] of the formatted message.
#[macro_export]
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::ReportError::Invalid(format!($($arg)*)))
    };
}

impl ReportError {
    /// The error and each of its causes, joined by ": " on one line, as the binary prints
    /// them (anyhow's `{:#}`).
    pub fn line(&self) -> String {
        let mut text = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            text.push_str(": ");
            text.push_str(&c.to_string());
            cause = c.source();
        }
        text
    }
}

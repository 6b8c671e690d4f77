//! The error type of the file stages. Every variant names what it is about
//! (a file, a stage, an item) and says what to do next.

use highwater_core::guard::Refusal;
use highwater_core::template::TemplateError;
use highwater_store::StoreError;
use std::path::PathBuf;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum FilesError {
    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("stage `{stage}`: {source}")]
    Template {
        stage: String,
        #[source]
        source: TemplateError,
    },
    #[error("stage `{stage}`: command `{program}` was not found (looked in {looked}); install it or fix `command` in the config")]
    CommandNotFound {
        stage: String,
        program: String,
        looked: String,
    },
    #[error("stage `{stage}`: input {path} cannot be read: {source}. Fix its permissions or remove it, then run again")]
    InputUnreadable {
        stage: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("stage `{stage}`: input glob `{pattern}` is invalid: {message}")]
    Glob {
        stage: String,
        pattern: String,
        message: String,
    },
    #[error("stage `{stage}`: input path {path:?} is not valid UTF-8; rename it")]
    NonUtf8Path { stage: String, path: PathBuf },
    #[error("stage `{stage}`: inputs `{first}` and `{second}` both render to output `{output}`; use {{relpath}} in the template")]
    OutputCollision {
        stage: String,
        output: String,
        first: String,
        second: String,
    },
    #[error("the state store {state} is inside the output root `{root}` of stage `{stage}`; anything that syncs the outputs would ship it. Move `[state] store` elsewhere")]
    StateInsideOutput {
        state: PathBuf,
        stage: String,
        root: String,
    },
    #[error("stage `{stage}`: recipe file {path} cannot be read: {source}. Fix `recipe.files`")]
    RecipeFile {
        stage: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("stage `{stage}`: recipe tool command `{command}` could not run: {message}. Fix `recipe.tools`")]
    RecipeTool {
        stage: String,
        command: String,
        message: String,
    },
    #[error("another highwater run holds the lock {path}; wait for it to finish (or remove the lock file if no highwater process is running)")]
    Locked { path: PathBuf },
    #[error("stages form a cycle through {stages}: each one's inputs match the next one's outputs. Break the cycle")]
    Cycle { stages: String },
    #[error("no stage named `{name}`; the config has: {known}")]
    UnknownStage { name: String, known: String },
    #[error("{}", refusals.iter().map(|r| r.to_string()).collect::<Vec<_>>().join("\n"))]
    Guard { refusals: Vec<Refusal> },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl FilesError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        FilesError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

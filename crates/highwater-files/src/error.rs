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
    #[error("stage `{stage}`: object storage: {message}. Check the bucket, the endpoint and the AWS_* credentials")]
    Storage { stage: String, message: String },
    #[error("stage `{stage}`: {what} `{value}` names storage `{place}`, which the config does not define; add a [storage.{place}] table{known}")]
    UnknownPlace {
        stage: String,
        what: &'static str,
        value: String,
        place: String,
        known: String,
    },
    #[error("stage `{stage}`: {message}")]
    Places { stage: String, message: String },
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
    #[error("stage `{stage}`: input `{input}` is also where the stage writes (output `{output}`); running would overwrite the input. Change `output` or narrow `inputs`")]
    OutputOverwritesInput {
        stage: String,
        input: String,
        output: String,
    },
    #[error("stage `{stage}`: input `{input}` is one of the stage's own outputs; its outputs would become its inputs on every run (out/out/...). Narrow `inputs` so they exclude `{root}`")]
    InputIsOwnOutput {
        stage: String,
        input: String,
        root: String,
    },
    #[error("{first_what} {first} and {second_what} {second} are the same place, or one lies inside the other: one would destroy the other. Give them separate paths")]
    PlacesCollide {
        first_what: String,
        first: PathBuf,
        second_what: String,
        second: PathBuf,
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
    #[error("another highwater run holds the lock {path}; wait for it to finish. The lock is released when that process exits, even when it is killed, so do not delete the lock file: that would let two runs in at once")]
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
    #[error("stage `{stage}`: {message}")]
    Observe { stage: String, message: String },
    #[error("stage `{stage}` has no item `{item}` with recorded dependencies; `highwater deps {stage}` lists those it has")]
    UnknownItem { stage: String, item: String },
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

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
    /// A stage over another kind of input than globs (issue 49) that
    /// cannot be read: its source unknown, its windows unreadable.
    #[error("stage `{stage}`: {message}")]
    Inputs { stage: String, message: String },
    #[error("stage `{stage}`: compare: {message}")]
    Compare { stage: String, message: String },
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
    #[error("stage `{stage}` is declared in two places: {ours} and {theirs}. Stage names are one namespace per state store, and the two would delete each other's outputs; nothing was run. Rename one of them (`name=` on the Python decorator, or the `[stages.{stage}]` table in highwater.toml), or give one a state store of its own; if {theirs} no longer declares `{stage}`, remove the name from it")]
    StageDeclaredTwice {
        stage: String,
        ours: String,
        theirs: String,
    },
    #[error("stages `{first_stage}` and `{second_stage}` both write `{output}` (from `{first_input}` and `{second_input}`): the later would overwrite the earlier, and both would be recorded as done. Give the stages separate output roots or templates")]
    StagesShareOutput {
        output: String,
        first_stage: String,
        first_input: String,
        second_stage: String,
        second_input: String,
    },
    #[error("stage `{stage}`: the output folder {path} cannot be written ({reason}); nothing was run. Make it writable (or point `output` elsewhere), then run again")]
    OutputUnwritable {
        stage: String,
        path: PathBuf,
        reason: String,
    },
    #[error("stage `{stage}`: this process's recipe {ours} is not the recipe of the stage's queued plan, {theirs} (queued on {planned_by}; held now by {holders}): two configs of one stage are running side by side, as in a rolling deploy. Nothing was run here; run every process with one config (the items queued under {theirs} are done by its processes)")]
    RecipeQueued {
        stage: String,
        ours: String,
        theirs: String,
        planned_by: String,
        holders: String,
    },
    #[error("stage `{stage}`: this process's recipe {ours} was replaced by recipe {theirs} (planned on {planned_by}): this config is older than the one the fleet runs now. Nothing was run here; deploy the current config on this host. To roll back to {ours} on purpose, run with --force")]
    RecipeReplaced {
        stage: String,
        ours: String,
        theirs: String,
        planned_by: String,
    },
    #[error(
        "stage `{stage}`: {reason}\nThe run stopped with work unfinished: {unfinished}. {advice}"
    )]
    Unfinished {
        stage: String,
        /// The source with its causes, so that the lowest one (a broken
        /// pipe, a refused connection) reads before the advice.
        reason: String,
        unfinished: String,
        advice: String,
        #[source]
        source: Box<FilesError>,
    },
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
    /// The exit code this error ends a command with: 1 when the command
    /// had started its work and stopped with it unfinished, 2 (refused,
    /// nothing touched) otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            FilesError::Unfinished { .. } => 1,
            _ => 2,
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        FilesError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

//! Gathers the parts of a stage's recipe: hashes declared code files and runs
//! declared tool-version commands. The id itself is computed by
//! `highwater_core::recipe`, which sees only relative paths and outputs.

use crate::error::FilesError;
use crate::spec::{StageSpec, Transform};
use highwater_core::recipe::{recipe_id, RecipeParts};
use std::path::Path;
use std::process::{Command, Stdio};

/// A tool's version output is hashed up to this many bytes; beyond it a tool
/// is printing something other than a version.
pub const TOOL_OUTPUT_MAX_BYTES: usize = 64 * 1024;

/// Computes the recipe id of a stage.
pub fn stage_recipe_id(root: &Path, stage: &StageSpec) -> Result<String, FilesError> {
    let mut parts = RecipeParts {
        version: stage.recipe.version.clone(),
        config: stage.recipe.config.clone(),
        output: stage.output.clone(),
        ..RecipeParts::default()
    };
    parts.command = match &stage.transform {
        Transform::Command(argv) => argv.clone(),
        // A closure's code cannot be hashed from here; `recipe.version`
        // stands for it.
        Transform::Closure(_) => vec!["<closure>".to_string()],
    };
    for f in &stage.recipe.files {
        let path = root.join(f);
        let bytes = std::fs::read(&path).map_err(|source| FilesError::RecipeFile {
            stage: stage.name.clone(),
            path: path.clone(),
            source,
        })?;
        // The path as written in the config, never the absolute one: moving
        // the project must not change the recipe.
        parts
            .files
            .push((f.clone(), blake3::hash(&bytes).to_hex().to_string()));
    }
    for t in &stage.recipe.tools {
        parts
            .tools
            .push((t.clone(), run_tool(root, &stage.name, t)?));
    }
    Ok(recipe_id(&parts))
}

/// Runs a tool-version command without a shell and returns its exit status
/// and output. A non-zero exit is recorded, not refused: `sh --version`
/// exits 2 on dash, and that answer is as stable as a version string.
fn run_tool(root: &Path, stage: &str, command: &str) -> Result<String, FilesError> {
    let argv: Vec<&str> = command.split_whitespace().collect();
    let Some((program, args)) = argv.split_first() else {
        return Err(FilesError::RecipeTool {
            stage: stage.to_string(),
            command: command.to_string(),
            message: "the command is empty".into(),
        });
    };
    let out = Command::new(program)
        .args(args)
        .current_dir(root)
        .stdin(Stdio::null())
        .env("LC_ALL", "C")
        .output()
        .map_err(|e| FilesError::RecipeTool {
            stage: stage.to_string(),
            command: command.to_string(),
            message: e.to_string(),
        })?;
    let mut text = format!("exit:{}\n", out.status.code().unwrap_or(-1));
    let mut both = out.stdout;
    both.extend_from_slice(&out.stderr);
    both.truncate(TOOL_OUTPUT_MAX_BYTES);
    text.push_str(&String::from_utf8_lossy(&both));
    Ok(text)
}

//! The recipe id: a hash of everything except the input that shapes an
//! output. The reader gathers the parts (file contents, tool output); this
//! module only hashes them, in a canonical form with sorted keys, so that the
//! same parts always give the same id.
//!
//! Nothing volatile may go in: no absolute paths, no timestamps, no host
//! names. Such a leak makes every item look changed on every run, which the
//! guard then reports.

use serde::Serialize;

/// The format version of the recipe hash itself. It is part of the id so that
/// a deliberate change of the hashed parts is visible; it changes only
/// together with a migration that rewrites stored recipe ids.
const RECIPE_FORMAT: u32 = 1;

/// Everything but the input that shapes a stage's output.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct RecipeParts {
    /// The user's own version string for the stage's logic.
    pub version: String,
    /// The stage's config table, as JSON (object keys are sorted).
    pub config: serde_json::Value,
    /// Declared code files: path relative to the config folder, and the
    /// BLAKE3 digest of the contents.
    pub files: Vec<(String, String)>,
    /// Declared tool-version commands and what they printed.
    pub tools: Vec<(String, String)>,
    /// The command argv template (not the rendered argv): changing the
    /// command changes the output.
    pub command: Vec<String>,
    /// The output template: moving outputs re-makes them where they now belong.
    pub output: String,
}

#[derive(Serialize)]
struct Canonical<'a> {
    format: u32,
    #[serde(flatten)]
    parts: &'a RecipeParts,
}

/// The recipe id, `r1:` and 32 hex digits of BLAKE3.
pub fn recipe_id(parts: &RecipeParts) -> String {
    let mut sorted = parts.clone();
    sorted.files.sort();
    sorted.tools.sort();
    let json = serde_json::to_vec(&Canonical {
        format: RECIPE_FORMAT,
        parts: &sorted,
    })
    .expect("recipe parts always serialize");
    let hash = blake3::hash(&json);
    format!("r1:{}", &hash.to_hex()[..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_changes_the_id_and_order_does_not() {
        let base = RecipeParts {
            version: "1".into(),
            config: serde_json::json!({"crs": "EPSG:3857", "a": 1}),
            files: vec![
                ("a.sh".into(), "b3:00".into()),
                ("b.sh".into(), "b3:11".into()),
            ],
            tools: vec![("sh --version".into(), "5.2".into())],
            command: vec!["sh".into(), "{input}".into()],
            output: "out/{relpath}".into(),
        };
        let id = recipe_id(&base);
        let mut reordered = base.clone();
        reordered.files.reverse();
        reordered.config = serde_json::json!({"a": 1, "crs": "EPSG:3857"});
        assert_eq!(recipe_id(&reordered), id);
        type Edit = Box<dyn Fn(&mut RecipeParts)>;
        let variants: Vec<Edit> = vec![
            Box::new(|p| p.version = "2".into()),
            Box::new(|p| p.config = serde_json::json!({"crs": "EPSG:4326", "a": 1})),
            Box::new(|p| p.files[0].1 = "b3:01".into()),
            Box::new(|p| p.tools[0].1 = "5.3".into()),
            Box::new(|p| p.command.push("x".into())),
            Box::new(|p| p.output = "out2/{relpath}".into()),
        ];
        for v in variants {
            let mut p = base.clone();
            v(&mut p);
            assert_ne!(recipe_id(&p), id, "{p:?}");
        }
    }
}

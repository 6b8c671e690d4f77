//! Output path templates and command argument templates.
//!
//! An output template such as `out/{relpath}.upper` has a literal *output
//! root* (`out`) before its first placeholder. Every rendered path must stay
//! under that root: a rendered path with a `..` component after the root, or
//! an absolute path produced by a placeholder, is refused. A template with no
//! placeholder at all names one output for the whole stage: an aggregate.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum TemplateError {
    #[error("template `{template}` is empty; give an output path such as `out/{{relpath}}`")]
    Empty { template: String },
    #[error("template `{template}` has an unclosed `{{`; close it or remove it")]
    Unclosed { template: String },
    #[error("template `{template}` uses unknown placeholder `{{{name}}}`; known ones are {known}")]
    Unknown {
        template: String,
        name: String,
        known: &'static str,
    },
    #[error(
        "template `{template}` renders `{rendered}` for input `{relpath}`, which escapes the output root `{}`; remove `..` from the template",
        if root.is_empty() { "." } else { root.as_str() }
    )]
    Escapes {
        template: String,
        relpath: String,
        rendered: String,
        root: String,
    },
    #[error("`{{inputs}}` must stand alone as one argument in `{arg}`; it expands to one argument per input")]
    InputsNotAlone { arg: String },
    #[error("`{{files}}` must stand alone as one argument in `{arg}`; it expands to one argument per data file")]
    FilesNotAlone { arg: String },
}

/// Which placeholders a stage's templates may use: those of an input path
/// (a stage over globs), or those of a window (a stage over a source's
/// landed windows, issue 49). A template of one kind refuses the other's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Vars {
    #[default]
    Paths,
    /// The item's relpath is `START/END` (RFC 3339): `{window_start}`,
    /// `{window_end}`, `{day}` and `{month}` are read from it.
    Windows,
}

/// The placeholders an output template may use, derived from an input's path
/// relative to its glob's base folder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Var {
    RelPath,
    Dir,
    Stem,
    Name,
    Ext,
    /// Only in command arguments.
    Input,
    Output,
    Inputs,
    /// Window placeholders (issue 49), read from a `START/END` relpath.
    WindowStart,
    WindowEnd,
    Day,
    Month,
    /// Only in command arguments of a stage over windows: the window's
    /// current data files, one argument each.
    Files,
}

const OUTPUT_VARS: &str = "{relpath} {dir} {stem} {name} {ext}";
const WINDOW_OUTPUT_VARS: &str = "{window_start} {window_end} {day} {month}";

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Lit(String),
    Var(Var),
}

fn parse_parts(
    template: &str,
    allow_command_vars: bool,
    vars: Vars,
) -> Result<Vec<Part>, TemplateError> {
    let mut parts = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            parts.push(Part::Lit(rest[..open].to_string()));
        }
        let after = &rest[open + 1..];
        let close = after.find('}').ok_or_else(|| TemplateError::Unclosed {
            template: template.to_string(),
        })?;
        let name = &after[..close];
        let paths = vars == Vars::Paths;
        let var = match name {
            "relpath" if paths => Var::RelPath,
            "dir" if paths => Var::Dir,
            "stem" if paths => Var::Stem,
            "name" if paths => Var::Name,
            "ext" if paths => Var::Ext,
            "input" if paths && allow_command_vars => Var::Input,
            "inputs" if paths && allow_command_vars => Var::Inputs,
            "output" if allow_command_vars => Var::Output,
            "window_start" if !paths => Var::WindowStart,
            "window_end" if !paths => Var::WindowEnd,
            "day" if !paths => Var::Day,
            "month" if !paths => Var::Month,
            "files" if !paths && allow_command_vars => Var::Files,
            _ => {
                return Err(TemplateError::Unknown {
                    template: template.to_string(),
                    name: name.to_string(),
                    known: match (vars, allow_command_vars) {
                        (Vars::Paths, true) => {
                            "{input} {output} {inputs} {relpath} {dir} {stem} {name} {ext}"
                        }
                        (Vars::Paths, false) => OUTPUT_VARS,
                        (Vars::Windows, true) => {
                            "{output} {files} {window_start} {window_end} {day} {month}"
                        }
                        (Vars::Windows, false) => WINDOW_OUTPUT_VARS,
                    },
                })
            }
        };
        parts.push(Part::Var(var));
        rest = &after[close + 1..];
    }
    if !rest.is_empty() {
        parts.push(Part::Lit(rest.to_string()));
    }
    Ok(parts)
}

/// The values of the path placeholders for one input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathVars<'a> {
    pub relpath: &'a str,
    pub dir: &'a str,
    pub name: &'a str,
    pub stem: &'a str,
    pub ext: &'a str,
}

impl<'a> PathVars<'a> {
    /// Splits a `/`-separated relative path into its placeholders. `ext` is
    /// the part after the last dot of the name (without the dot), and `stem`
    /// the part before it; a leading dot does not start an extension.
    pub fn of(relpath: &'a str) -> PathVars<'a> {
        // Byte scans (once per item per plan; `/` and `.` are ASCII, so the
        // cuts fall on character boundaries).
        let (dir, name) = match relpath.bytes().rposition(|b| b == b'/') {
            Some(i) => (&relpath[..i], &relpath[i + 1..]),
            None => ("", relpath),
        };
        let (stem, ext) = match name.bytes().rposition(|b| b == b'.') {
            Some(i) if i > 0 => (&name[..i], &name[i + 1..]),
            _ => (name, ""),
        };
        PathVars {
            relpath,
            dir,
            name,
            stem,
            ext,
        }
    }

    fn get(&self, var: Var) -> &'a str {
        match var {
            Var::RelPath => self.relpath,
            Var::Dir => self.dir,
            Var::Stem => self.stem,
            Var::Name => self.name,
            Var::Ext => self.ext,
            // A window item's relpath is `START/END`, both RFC 3339, so
            // the day and the month are the start's first characters.
            Var::WindowStart => self
                .relpath
                .split_once('/')
                .map_or(self.relpath, |(s, _)| s),
            Var::WindowEnd => self.relpath.split_once('/').map_or("", |(_, e)| e),
            Var::Day => self.relpath.get(..10).unwrap_or(self.relpath),
            Var::Month => self.relpath.get(..7).unwrap_or(self.relpath),
            Var::Input | Var::Output | Var::Inputs | Var::Files => {
                unreachable!("not a path placeholder")
            }
        }
    }
}

/// A parsed output path template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputTemplate {
    raw: String,
    parts: Vec<Part>,
    root: String,
}

impl OutputTemplate {
    pub fn parse(raw: &str) -> Result<OutputTemplate, TemplateError> {
        OutputTemplate::parse_in(raw, Vars::Paths)
    }

    /// Parses a template whose placeholders are of kind `vars`.
    pub fn parse_in(raw: &str, vars: Vars) -> Result<OutputTemplate, TemplateError> {
        if raw.trim().is_empty() {
            return Err(TemplateError::Empty {
                template: raw.to_string(),
            });
        }
        let parts = parse_parts(raw, false, vars)?;
        let literal_prefix = match parts.first() {
            Some(Part::Lit(s)) if parts.len() > 1 => s.as_str(),
            Some(Part::Lit(s)) => s.as_str(),
            _ => "",
        };
        let has_vars = parts.iter().any(|p| matches!(p, Part::Var(_)));
        let root = if has_vars {
            match literal_prefix.rfind('/') {
                Some(i) => literal_prefix[..i].to_string(),
                None => String::new(),
            }
        } else {
            match raw.rfind('/') {
                Some(i) => raw[..i].to_string(),
                None => String::new(),
            }
        };
        let root = normalize_lexically(&root);
        Ok(OutputTemplate {
            raw: raw.to_string(),
            parts,
            root,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// The literal folder every output lives under, relative to the config
    /// file's folder (or absolute). Empty means the config folder itself.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// True when the template has no placeholder, so the stage is an
    /// aggregate with one output.
    pub fn is_aggregate(&self) -> bool {
        !self.parts.iter().any(|p| matches!(p, Part::Var(_)))
    }

    /// Renders the output path for one input, refusing any path that leaves
    /// the output root.
    pub fn render(&self, relpath: &str) -> Result<String, TemplateError> {
        let vars = PathVars::of(relpath);
        let mut out = String::with_capacity(self.raw.len() + relpath.len());
        for part in &self.parts {
            match part {
                Part::Lit(s) => out.push_str(s),
                Part::Var(v) => out.push_str(vars.get(*v)),
            }
        }
        let normalized = normalize_owned(out);
        let escapes = || TemplateError::Escapes {
            template: self.raw.clone(),
            relpath: relpath.to_string(),
            rendered: normalized.clone(),
            root: self.root.clone(),
        };
        let rest = if self.root.is_empty() {
            if normalized.starts_with('/') {
                return Err(escapes());
            }
            normalized.as_str()
        } else {
            match normalized.strip_prefix(self.root.as_str()) {
                Some(r) if r.starts_with('/') => &r[1..],
                _ => return Err(escapes()),
            }
        };
        if rest.is_empty()
            || rest
                .as_bytes()
                .split(|&b| b == b'/')
                .any(|c| c == b".." || c.is_empty())
        {
            return Err(escapes());
        }
        Ok(normalized)
    }
}

/// Folds `.` components and repeated or trailing slashes. It keeps `..`
/// components so that the escape check sees them.
pub fn normalize_lexically(path: &str) -> String {
    if is_normal(path) {
        return path.to_string();
    }
    fold(path)
}

/// [`normalize_lexically`] of an owned path: the common, already normal
/// case is returned as it is, without a copy (render runs once per item on
/// every plan).
fn normalize_owned(path: String) -> String {
    if is_normal(&path) {
        return path;
    }
    fold(&path)
}

fn is_normal(path: &str) -> bool {
    // One byte pass over the path, not five substring searches: it runs
    // once per item of every plan.
    let b = path.as_bytes();
    let slash_then = |i: usize, next: &[u8]| b[i + 1..].starts_with(next);
    !b.is_empty()
        && !b.starts_with(b"./")
        && !b.ends_with(b"/")
        && !b.ends_with(b"/.")
        && b != b"."
        && !(0..b.len())
            .filter(|&i| b[i] == b'/')
            .any(|i| slash_then(i, b"/") || slash_then(i, b"./"))
}

fn fold(path: &str) -> String {
    let absolute = path.starts_with('/');
    let comps: Vec<&str> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    let joined = comps.join("/");
    if absolute {
        format!("/{joined}")
    } else {
        joined
    }
}

/// One command argument template, such as `{input}` or `--out={output}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgTemplate {
    parts: Vec<Part>,
}

/// The values a command argument can use for one item.
pub struct ArgValues<'a> {
    pub input: &'a str,
    pub output: &'a str,
    pub inputs: &'a [String],
    pub relpath: &'a str,
}

impl ArgTemplate {
    pub fn parse(arg: &str) -> Result<ArgTemplate, TemplateError> {
        ArgTemplate::parse_in(arg, Vars::Paths)
    }

    /// Parses an argument whose placeholders are of kind `vars`.
    pub fn parse_in(arg: &str, vars: Vars) -> Result<ArgTemplate, TemplateError> {
        let parts = parse_parts(arg, true, vars)?;
        if parts.contains(&Part::Var(Var::Inputs)) && parts.len() != 1 {
            return Err(TemplateError::InputsNotAlone {
                arg: arg.to_string(),
            });
        }
        if parts.contains(&Part::Var(Var::Files)) && parts.len() != 1 {
            return Err(TemplateError::FilesNotAlone {
                arg: arg.to_string(),
            });
        }
        Ok(ArgTemplate { parts })
    }

    /// Appends this argument's expansion to `argv`. Each value becomes (part
    /// of) one argument: nothing is ever split or interpreted by a shell.
    pub fn expand_into(&self, v: &ArgValues<'_>, argv: &mut Vec<String>) {
        if self.parts == [Part::Var(Var::Inputs)] || self.parts == [Part::Var(Var::Files)] {
            argv.extend(v.inputs.iter().cloned());
            return;
        }
        let vars = PathVars::of(v.relpath);
        let mut s = String::new();
        for part in &self.parts {
            match part {
                Part::Lit(l) => s.push_str(l),
                Part::Var(Var::Input) => s.push_str(v.input),
                Part::Var(Var::Output) => s.push_str(v.output),
                Part::Var(Var::Inputs | Var::Files) => unreachable!("checked in parse"),
                Part::Var(var) => s.push_str(vars.get(*var)),
            }
        }
        argv.push(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The byte pass of `is_normal` says what the five searches it
        /// replaced said, over paths made of `/`, `.` and a letter.
        #[test]
        fn is_normal_is_the_five_searches(path in "[/.a]{0,8}") {
            let searches = !path.is_empty()
                && !path.contains("//")
                && !path.starts_with("./")
                && !path.contains("/./")
                && !path.ends_with('/')
                && !path.ends_with("/.")
                && path != ".";
            prop_assert_eq!(is_normal(&path), searches);
        }
    }

    #[test]
    fn renders_placeholders() {
        let t = OutputTemplate::parse("out/{dir}/{stem}.{ext}.up").unwrap();
        assert_eq!(t.root(), "out");
        assert_eq!(t.render("a/b/c.txt").unwrap(), "out/a/b/c.txt.up");
        assert_eq!(t.render("c.txt").unwrap(), "out/c.txt.up");
        let t = OutputTemplate::parse("./out/x/{relpath}").unwrap();
        assert_eq!(t.root(), "out/x");
        assert_eq!(
            t.render("my file; $(rm).txt").unwrap(),
            "out/x/my file; $(rm).txt"
        );
    }

    #[test]
    fn refuses_escapes() {
        let t = OutputTemplate::parse("out/{stem}/../../../etc/{name}").unwrap();
        assert!(matches!(
            t.render("a.txt"),
            Err(TemplateError::Escapes { .. })
        ));
        let t = OutputTemplate::parse("{relpath}").unwrap();
        assert!(matches!(
            t.render("../x"),
            Err(TemplateError::Escapes { .. })
        ));
        let t = OutputTemplate::parse("{dir}").unwrap();
        assert_eq!(t.root(), "");
        assert!(
            t.render("x.txt").is_err(),
            "an empty output path is refused"
        );
    }

    #[test]
    fn aggregate_and_errors() {
        let t = OutputTemplate::parse("out/all.txt").unwrap();
        assert!(t.is_aggregate());
        assert_eq!(t.root(), "out");
        assert!(matches!(
            OutputTemplate::parse("out/{nope}"),
            Err(TemplateError::Unknown { .. })
        ));
        assert!(matches!(
            OutputTemplate::parse("out/{stem"),
            Err(TemplateError::Unclosed { .. })
        ));
        assert!(ArgTemplate::parse("x{inputs}").is_err());
    }

    #[test]
    fn window_placeholders_come_from_the_window() {
        let t = OutputTemplate::parse_in("marts/{month}/{day}.parquet", Vars::Windows).unwrap();
        assert_eq!(t.root(), "marts");
        let rel = "2026-03-14T00:00:00Z/2026-03-15T00:00:00Z";
        assert_eq!(t.render(rel).unwrap(), "marts/2026-03/2026-03-14.parquet");
        assert!(OutputTemplate::parse_in("m/{stem}", Vars::Windows).is_err());
        assert!(OutputTemplate::parse("m/{day}").is_err());
        let files = vec!["a.parquet".to_string(), "b c.parquet".to_string()];
        let v = ArgValues {
            input: "",
            output: "o",
            inputs: &files,
            relpath: rel,
        };
        let mut argv = Vec::new();
        for a in ["{window_start}", "--to={window_end}", "{files}", "{output}"] {
            ArgTemplate::parse_in(a, Vars::Windows)
                .unwrap()
                .expand_into(&v, &mut argv);
        }
        assert_eq!(
            argv,
            [
                "2026-03-14T00:00:00Z",
                "--to=2026-03-15T00:00:00Z",
                "a.parquet",
                "b c.parquet",
                "o"
            ]
        );
        assert!(ArgTemplate::parse_in("x{files}", Vars::Windows).is_err());
        assert!(ArgTemplate::parse_in("{input}", Vars::Windows).is_err());
        assert!(ArgTemplate::parse("{files}").is_err());
    }

    #[test]
    fn args_expand_without_splitting() {
        let inputs = vec!["a b".to_string(), "c;d".to_string()];
        let v = ArgValues {
            input: "in put",
            output: "o$(x)",
            inputs: &inputs,
            relpath: "d/f.txt",
        };
        let mut argv = Vec::new();
        for a in ["{input}", "--o={output}", "{inputs}", "{stem}"] {
            ArgTemplate::parse(a).unwrap().expand_into(&v, &mut argv);
        }
        assert_eq!(argv, ["in put", "--o=o$(x)", "a b", "c;d", "f"]);
    }
}

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
}

const OUTPUT_VARS: &str = "{relpath} {dir} {stem} {name} {ext}";

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Lit(String),
    Var(Var),
}

fn parse_parts(template: &str, allow_command_vars: bool) -> Result<Vec<Part>, TemplateError> {
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
        let var = match name {
            "relpath" => Var::RelPath,
            "dir" => Var::Dir,
            "stem" => Var::Stem,
            "name" => Var::Name,
            "ext" => Var::Ext,
            "input" if allow_command_vars => Var::Input,
            "output" if allow_command_vars => Var::Output,
            "inputs" if allow_command_vars => Var::Inputs,
            _ => {
                return Err(TemplateError::Unknown {
                    template: template.to_string(),
                    name: name.to_string(),
                    known: if allow_command_vars {
                        "{input} {output} {inputs} {relpath} {dir} {stem} {name} {ext}"
                    } else {
                        OUTPUT_VARS
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
        let (dir, name) = match relpath.rfind('/') {
            Some(i) => (&relpath[..i], &relpath[i + 1..]),
            None => ("", relpath),
        };
        let (stem, ext) = match name.rfind('.') {
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
            Var::Input | Var::Output | Var::Inputs => unreachable!("not a path placeholder"),
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
        if raw.trim().is_empty() {
            return Err(TemplateError::Empty {
                template: raw.to_string(),
            });
        }
        let parts = parse_parts(raw, false)?;
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
        if rest.is_empty() || rest.split('/').any(|c| c == ".." || c.is_empty()) {
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
    !path.is_empty()
        && !path.contains("//")
        && !path.starts_with("./")
        && !path.contains("/./")
        && !path.ends_with('/')
        && !path.ends_with("/.")
        && path != "."
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
        let parts = parse_parts(arg, true)?;
        if parts.contains(&Part::Var(Var::Inputs)) && parts.len() != 1 {
            return Err(TemplateError::InputsNotAlone {
                arg: arg.to_string(),
            });
        }
        Ok(ArgTemplate { parts })
    }

    /// Appends this argument's expansion to `argv`. Each value becomes (part
    /// of) one argument: nothing is ever split or interpreted by a shell.
    pub fn expand_into(&self, v: &ArgValues<'_>, argv: &mut Vec<String>) {
        if self.parts == [Part::Var(Var::Inputs)] {
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
                Part::Var(Var::Inputs) => unreachable!("checked in parse"),
                Part::Var(var) => s.push_str(vars.get(*var)),
            }
        }
        argv.push(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

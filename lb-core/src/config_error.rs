//! Config errors: one type for every part of every config (the daemon's, a cluster
//! description, a VRRP instance's), and validation that reports every problem it finds, not
//! the first.
//!
//! A part validates its own fields with names relative to itself (`interval_ms`); the part
//! that holds it adds the path (`vips[0].health.interval_ms`) with [`ConfigErrors::within`].
//! So an operator fixing a config sees every field to fix in one run, each named the way the
//! file spells it.

use std::fmt;

/// One problem: the field it names (`vips[1].backends[0].weight`) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub reason: String,
}

impl ConfigError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// Every problem validation found, in the order it met them. Empty: the config is valid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigErrors(Vec<ConfigError>);

impl ConfigErrors {
    pub fn new() -> Self {
        Self::default()
    }

    /// Record a problem with `field`.
    pub fn add(&mut self, field: impl Into<String>, reason: impl Into<String>) {
        self.0.push(ConfigError::new(field, reason));
    }

    /// Record a problem made elsewhere.
    pub fn push(&mut self, e: ConfigError) {
        self.0.push(e);
    }

    /// Validate `part`, found at `path` of the config being validated: its problems are
    /// recorded with `path.` before their fields.
    pub fn within(&mut self, path: &str, part: &(impl Validate + ?Sized)) {
        let mut inner = ConfigErrors::new();
        part.validate_into(&mut inner);
        self.0.extend(inner.prefixed(path).0);
    }

    /// Every field named with `path.` before it (`path[i]` for an index; a `path` ending in a
    /// space is put before the field as is).
    pub fn prefixed(self, path: &str) -> Self {
        Self(
            self.0
                .into_iter()
                .map(|e| ConfigError {
                    field: join(path, &e.field),
                    reason: e.reason,
                })
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &ConfigError> {
        self.0.iter()
    }

    /// The fields named, in order (for tests and summaries).
    pub fn fields(&self) -> Vec<&str> {
        self.0.iter().map(|e| e.field.as_str()).collect()
    }

    /// `Ok` when nothing was found.
    pub fn into_result(self) -> Result<(), ConfigErrors> {
        if self.0.is_empty() { Ok(()) } else { Err(self) }
    }
}

fn join(path: &str, field: &str) -> String {
    match (path.is_empty(), field.is_empty()) {
        (true, _) => field.to_string(),
        (_, true) => path.to_string(),
        // An index, or a path that ends in its own separator (`nodes[0] (cp1): `), joins as is.
        _ if field.starts_with('[') || path.ends_with(' ') => format!("{path}{field}"),
        _ => format!("{path}.{field}"),
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        Self(vec![e])
    }
}

impl IntoIterator for ConfigErrors {
    type Item = ConfigError;
    type IntoIter = std::vec::IntoIter<ConfigError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// One problem a line, `field: reason`, in the order found: the first is what a single-error
/// reader would have seen, and each line can be fixed on its own.
impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return write!(f, "no problem");
        }
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// A part of a config that can tell what is wrong with it: the one validation signature.
pub trait Validate {
    /// Record every problem of `self` in `errors`, fields named relative to `self`.
    fn validate_into(&self, errors: &mut ConfigErrors);

    /// Every problem of `self`, or `Ok`.
    fn validate(&self) -> Result<(), ConfigErrors> {
        let mut errors = ConfigErrors::new();
        self.validate_into(&mut errors);
        errors.into_result()
    }

    /// Every problem of `self`, found at `path` of a larger config, named from there.
    fn validate_at(&self, path: &str) -> Result<(), ConfigErrors> {
        let mut errors = ConfigErrors::new();
        errors.within(path, self);
        errors.into_result()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Part {
        a: u32,
        b: u32,
    }

    impl Validate for Part {
        fn validate_into(&self, errors: &mut ConfigErrors) {
            if self.a == 0 {
                errors.add("a", "must not be 0");
            }
            if self.b == 0 {
                errors.add("b", "must not be 0");
            }
        }
    }

    struct Whole {
        parts: Vec<Part>,
        name: String,
    }

    impl Validate for Whole {
        fn validate_into(&self, errors: &mut ConfigErrors) {
            if self.name.is_empty() {
                errors.add("name", "must not be empty");
            }
            for (i, p) in self.parts.iter().enumerate() {
                errors.within(&format!("parts[{i}]"), p);
            }
        }
    }

    #[test]
    fn every_problem_is_reported_with_its_full_path() {
        let w = Whole {
            name: String::new(),
            parts: vec![Part { a: 1, b: 1 }, Part { a: 0, b: 0 }],
        };
        let e = w.validate().unwrap_err();
        assert_eq!(e.fields(), ["name", "parts[1].a", "parts[1].b"]);
        assert_eq!(
            e.to_string(),
            "name: must not be empty\nparts[1].a: must not be 0\nparts[1].b: must not be 0"
        );
    }

    #[test]
    fn one_problem_reads_as_field_and_reason() {
        let w = Whole {
            name: "x".into(),
            parts: vec![Part { a: 1, b: 0 }],
        };
        assert_eq!(
            w.validate().unwrap_err().to_string(),
            "parts[0].b: must not be 0"
        );
        assert!(
            Whole {
                name: "x".into(),
                parts: vec![]
            }
            .validate()
            .is_ok()
        );
    }

    #[test]
    fn paths_join_indexes_and_empty_fields() {
        assert_eq!(join("vips", "[0].name"), "vips[0].name");
        assert_eq!(join("sync", ""), "sync");
        assert_eq!(join("", "name"), "name");
        assert_eq!(join("nodes[0] (cp1): ", "x"), "nodes[0] (cp1): x");
    }
}

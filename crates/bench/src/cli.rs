//! A small command-line parser: `-x VALUE`, `--long VALUE`, `--long=VALUE`, no dependencies.

use std::fmt::Display;
use std::str::FromStr;

/// A usage error: the message says what was wrong with the command line.
#[derive(Debug)]
pub struct Usage(pub String);

/// Command-line arguments being consumed flag by flag.
#[derive(Debug)]
pub struct Args {
    items: Vec<String>,
    pos: usize,
    pending: Option<String>,
}

impl Args {
    /// The process's arguments, without the program name.
    pub fn from_env() -> Args {
        Args::new(
            std::env::args_os()
                .skip(1)
                .map(|s| s.to_string_lossy().into_owned()),
        )
    }

    /// Arguments from a list (without the program name).
    pub fn new(items: impl IntoIterator<Item = String>) -> Args {
        Args {
            items: items.into_iter().collect(),
            pos: 0,
            pending: None,
        }
    }

    /// The next flag (`-n`, `--iters`; `--iters=5` yields `--iters` and keeps `5` for
    /// [`Args::value`]), or `None` at the end. A positional argument, or a `--flag=value` whose
    /// value was not consumed, is a usage error.
    pub fn next_flag(&mut self) -> Result<Option<String>, Usage> {
        if let Some(v) = self.pending.take() {
            return Err(Usage(format!("unexpected value {v:?}")));
        }
        let Some(item) = self.items.get(self.pos).cloned() else {
            return Ok(None);
        };
        self.pos += 1;
        if !item.starts_with('-') || item == "-" {
            return Err(Usage(format!("unexpected argument {item:?}")));
        }
        if let (true, Some((flag, value))) = (item.starts_with("--"), item.split_once('=')) {
            self.pending = Some(value.to_string());
            return Ok(Some(flag.to_string()));
        }
        Ok(Some(item))
    }

    /// The value of `flag`: the `=value` part, or the next argument.
    pub fn value(&mut self, flag: &str) -> Result<String, Usage> {
        if let Some(v) = self.pending.take() {
            return Ok(v);
        }
        match self.items.get(self.pos) {
            Some(v) => {
                self.pos += 1;
                Ok(v.clone())
            }
            None => Err(Usage(format!("{flag} needs a value"))),
        }
    }

    /// The value of `flag` if one follows (`=value`, or a next argument not starting with `-`).
    pub fn optional_value(&mut self) -> Option<String> {
        if let Some(v) = self.pending.take() {
            return Some(v);
        }
        match self.items.get(self.pos) {
            Some(v) if !v.starts_with('-') => {
                self.pos += 1;
                Some(v.clone())
            }
            _ => None,
        }
    }

    /// The value of `flag` parsed as `T`.
    pub fn parse<T>(&mut self, flag: &str) -> Result<T, Usage>
    where
        T: FromStr,
        T::Err: Display,
    {
        let v = self.value(flag)?;
        v.parse()
            .map_err(|e| Usage(format!("bad value {v:?} for {flag}: {e}")))
    }

    /// Like [`Args::parse`], and checks `min <= value <= max`.
    pub fn parse_in<T>(&mut self, flag: &str, min: T, max: T) -> Result<T, Usage>
    where
        T: FromStr + PartialOrd + Display + Copy,
        T::Err: Display,
    {
        let v: T = self.parse(flag)?;
        if v < min || v > max {
            return Err(Usage(format!(
                "{flag} must be between {min} and {max}, not {v}"
            )));
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Args {
        Args::new(s.iter().map(|s| s.to_string()))
    }

    #[test]
    fn flags_and_values() {
        let mut a = args(&["-n", "5", "--size=64", "--server", "--json"]);
        assert_eq!(a.next_flag().unwrap().as_deref(), Some("-n"));
        assert_eq!(a.parse::<u32>("-n").unwrap(), 5);
        assert_eq!(a.next_flag().unwrap().as_deref(), Some("--size"));
        assert_eq!(a.parse_in::<usize>("--size", 1, 100).unwrap(), 64);
        assert_eq!(a.next_flag().unwrap().as_deref(), Some("--server"));
        assert_eq!(a.optional_value(), None);
        assert_eq!(a.next_flag().unwrap().as_deref(), Some("--json"));
        assert!(a.next_flag().unwrap().is_none());
    }

    #[test]
    fn errors() {
        assert!(args(&["x"]).next_flag().is_err());
        let mut a = args(&["-n"]);
        a.next_flag().unwrap();
        assert!(a.parse::<u32>("-n").is_err());
        let mut a = args(&["-n", "-3"]);
        a.next_flag().unwrap();
        assert!(a.parse::<u32>("-n").is_err());
        let mut a = args(&["--json=1", "--x"]);
        a.next_flag().unwrap();
        assert!(a.next_flag().is_err());
        let mut a = args(&["-n", "0"]);
        a.next_flag().unwrap();
        assert!(a.parse_in::<u32>("-n", 1, 10).is_err());
    }
}

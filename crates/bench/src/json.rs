//! One-line JSON output without dependencies.

use std::fmt::Write;

/// A JSON object being built, written on one line by [`Object::finish`].
#[derive(Debug, Default)]
pub struct Object {
    buf: String,
}

impl Object {
    /// An empty object.
    pub fn new() -> Object {
        Object::default()
    }

    fn key(&mut self, k: &str) {
        self.buf.push(if self.buf.is_empty() { '{' } else { ',' });
        string(&mut self.buf, k);
        self.buf.push(':');
    }

    /// Adds a string member.
    pub fn str(mut self, k: &str, v: &str) -> Object {
        self.key(k);
        string(&mut self.buf, v);
        self
    }

    /// Adds an integer member.
    pub fn int(mut self, k: &str, v: u64) -> Object {
        self.key(k);
        let _ = write!(self.buf, "{v}");
        self
    }

    /// Adds a number member; non-finite numbers become `null`.
    pub fn num(mut self, k: &str, v: f64) -> Object {
        self.key(k);
        if v.is_finite() {
            let _ = write!(self.buf, "{}", (v * 1e6).round() / 1e6);
        } else {
            self.buf.push_str("null");
        }
        self
    }

    /// Adds an array of objects.
    pub fn array(mut self, k: &str, items: Vec<Object>) -> Object {
        self.key(k);
        self.buf.push('[');
        for (i, o) in items.into_iter().enumerate() {
            if i > 0 {
                self.buf.push(',');
            }
            self.buf.push_str(&o.finish());
        }
        self.buf.push(']');
        self
    }

    /// The object as one line of JSON.
    pub fn finish(mut self) -> String {
        if self.buf.is_empty() {
            self.buf.push('{');
        }
        self.buf.push('}');
        self.buf
    }
}

fn string(buf: &mut String, s: &str) {
    buf.push('"');
    for c in s.chars() {
        match c {
            '"' => buf.push_str("\\\""),
            '\\' => buf.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(buf, "\\u{:04x}", c as u32);
            }
            c => buf.push(c),
        }
    }
    buf.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line() {
        let o = Object::new()
            .str("a", "x\"y\n")
            .int("n", 3)
            .num("f", 1.23456)
            .num("bad", f64::NAN)
            .array("r", vec![Object::new().int("k", 1), Object::new()]);
        assert_eq!(
            o.finish(),
            r#"{"a":"x\"y\u000a","n":3,"f":1.23456,"bad":null,"r":[{"k":1},{}]}"#
        );
    }
}

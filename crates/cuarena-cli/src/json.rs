//! A small JSON writer for `--json` (one object of numbers, strings and
//! arrays; no dependency for that).

/// A JSON object being written.
pub(crate) struct Json {
    out: String,
    first: bool,
}

/// JSON string literal of `s`.
fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            '\r' => q.push_str("\\r"),
            '\t' => q.push_str("\\t"),
            c if (c as u32) < 0x20 => q.push_str(&format!("\\u{:04x}", c as u32)),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

impl Json {
    pub(crate) fn object() -> Json {
        Json {
            out: "{".to_owned(),
            first: true,
        }
    }

    fn key(&mut self, k: &str) -> &mut Self {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        self.out.push_str(&quote(k));
        self.out.push(':');
        self
    }

    pub(crate) fn str(&mut self, k: &str, v: &str) -> &mut Self {
        self.key(k).out.push_str(&quote(v));
        self
    }

    pub(crate) fn num(&mut self, k: &str, v: u64) -> &mut Self {
        self.key(k).out.push_str(&v.to_string());
        self
    }

    pub(crate) fn bool(&mut self, k: &str, v: bool) -> &mut Self {
        self.key(k).out.push_str(if v { "true" } else { "false" });
        self
    }

    pub(crate) fn opt_num(&mut self, k: &str, v: Option<u64>) -> &mut Self {
        match v {
            Some(v) => self.num(k, v),
            None => {
                self.key(k).out.push_str("null");
                self
            }
        }
    }

    pub(crate) fn opt_f64(&mut self, k: &str, v: Option<f64>) -> &mut Self {
        match v.filter(|v| v.is_finite()) {
            Some(v) => {
                self.key(k).out.push_str(&format!("{v:.6}"));
                self
            }
            None => {
                self.key(k).out.push_str("null");
                self
            }
        }
    }

    pub(crate) fn nums(&mut self, k: &str, v: impl Iterator<Item = u64>) -> &mut Self {
        let items: Vec<String> = v.map(|n| n.to_string()).collect();
        self.key(k).out.push_str(&format!("[{}]", items.join(",")));
        self
    }

    pub(crate) fn array(&mut self, k: &str, v: Vec<Json>) -> &mut Self {
        let items: Vec<String> = v.into_iter().map(Json::finish).collect();
        self.key(k).out.push_str(&format!("[{}]", items.join(",")));
        self
    }

    pub(crate) fn finish(mut self) -> String {
        self.out.push('}');
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_an_object() {
        let mut inner = Json::object();
        inner.num("a", 1);
        let mut j = Json::object();
        j.str("s", "a\"b\\\n\u{1}")
            .num("n", 7)
            .bool("t", true)
            .opt_num("z", None)
            .opt_f64("f", Some(1.5))
            .opt_f64("nan", Some(f64::NAN))
            .nums("l", [1, 2].into_iter())
            .array("o", vec![inner]);
        assert_eq!(
            j.finish(),
            r#"{"s":"a\"b\\\n\u0001","n":7,"t":true,"z":null,"f":1.500000,"nan":null,"l":[1,2],"o":[{"a":1}]}"#
        );
    }
}

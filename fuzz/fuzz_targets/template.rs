//! The placeholder renderer against a reference written apart from it: a `{name}` whose
//! braces hold nothing but a known name is replaced, one that looks like a name but is
//! unknown is refused, every other byte is text. A `{re.GROUP}` is refused too (no regex
//! here), but only after the whole text has no unknown name.
#![no_main]

use libfuzzer_sys::fuzz_target;

const NAMES: [&str; 10] = [
    "host",
    "path",
    "query",
    "uri",
    "client_ip",
    "scheme",
    "method",
    "tls_client_subject",
    "tls_client_san",
    "tls_client_fingerprint",
];

/// `{re.G}`'s G: a number, or a name that does not start with a digit.
fn is_group(g: &str) -> bool {
    let mut chars = g.chars();
    match chars.next() {
        None => false,
        Some(c) if c.is_ascii_digit() => {
            g.chars().all(|c| c.is_ascii_digit()) && g.parse::<usize>().is_ok()
        }
        Some(c) => {
            (c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
    }
}

fn reference(text: &str, v: &[Option<&str>; 6]) -> Result<String, String> {
    let value = |name: &str| -> String {
        let get = |i: usize| v[i].unwrap_or("").to_string();
        match name {
            "host" => get(0),
            "path" => get(1),
            "query" => get(2),
            "uri" => match v[2] {
                Some(q) => format!("{}?{q}", get(1)),
                None => get(1),
            },
            "method" => get(3),
            "client_ip" => get(4),
            "scheme" => get(5),
            _ => String::new(),
        }
    };
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::new();
    let mut group = None;
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '{' {
            // The braces' content: up to the next `}`, with no `{` inside.
            let close = chars[i + 1..].iter().position(|&c| c == '}' || c == '{');
            if let Some(k) = close.filter(|&k| chars[i + 1 + k] == '}') {
                let name: String = chars[i + 1..i + 1 + k].iter().collect();
                if let Some(g) = name.strip_prefix("re.") {
                    if !is_group(g) {
                        return Err(name);
                    }
                    // Shown as its number: `re.07` is group 7.
                    group.get_or_insert(match g.parse::<usize>() {
                        Ok(n) => format!("re.{n}"),
                        Err(_) => name,
                    });
                    i += k + 2;
                    continue;
                }
                if NAMES.contains(&name.as_str()) {
                    out.push_str(&value(&name));
                    i += k + 2;
                    continue;
                }
                if !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                    return Err(name);
                }
            }
        }
        out.push(chars[i]);
        i += 1;
    }
    match group {
        Some(name) => Err(name),
        None => Ok(out),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    // text NUL host NUL path NUL query NUL method NUL client_ip NUL scheme
    let mut parts = s.split('\0');
    let text = parts.next().unwrap_or("");
    let mut v = [None; 6];
    for (slot, p) in v.iter_mut().zip(parts) {
        *slot = Some(p);
    }
    let got = sluice::fuzzing::template(text, v);
    assert_eq!(got, reference(text, &v), "{text:?} with {v:?}");
});

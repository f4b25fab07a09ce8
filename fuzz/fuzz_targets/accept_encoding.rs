//! The Accept-Encoding negotiation against a reference: the coding chosen is one the
//! client accepts (q > 0, by name or by `*`), and none it accepts more.
#![no_main]

use libfuzzer_sys::fuzz_target;

/// RFC 9110 §12.4.2, read off the grammar: `qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1"
/// [ "." 0*3("0") ] )`, in thousandths; a value outside it counts as 0.
fn weight(v: &str) -> u32 {
    let (int, frac) = match v.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (v, None),
    };
    let frac = frac.unwrap_or("");
    if frac.len() > 3 || !frac.chars().all(|c| c.is_ascii_digit()) {
        return 0;
    }
    // "0." and "1." match the grammar: the digits after the dot may be none.
    let padded = format!("{frac:0<3}");
    match int {
        "1" if frac.chars().all(|c| c == '0') => 1000,
        "0" => padded.parse().unwrap_or(0),
        _ => 0,
    }
}

/// q in thousandths of each coding sluice offers, as the client states it.
fn accepted(accept: &str) -> [(&'static str, u32); 3] {
    let mut named: [Option<u32>; 3] = [None; 3];
    let mut star = None;
    for item in accept.split(',') {
        let mut params = item.split(';');
        let name = params.next().unwrap_or("").trim().to_ascii_lowercase();
        let mut q = 1000;
        for p in params {
            let p = p.trim();
            if p.len() >= 2 && p[..2].eq_ignore_ascii_case("q=") {
                q = weight(&p[2..]);
            }
        }
        match name.as_str() {
            "zstd" => named[0] = Some(q),
            "gzip" | "x-gzip" => named[1] = Some(q),
            "br" => named[2] = Some(q),
            "*" => star = Some(q),
            _ => {}
        }
    }
    let q = |i: usize| named[i].or(star).unwrap_or(0);
    [("zstd", q(0)), ("gzip", q(1)), ("br", q(2))]
}

fuzz_target!(|data: &[u8]| {
    let got = sluice::fuzzing::accept_encoding(data);
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if s.contains(|c: char| !c.is_ascii() || c.is_ascii_control() && c != '\t') {
        return;
    }
    let q = accepted(s);
    let best = q.iter().map(|(_, q)| *q).max().unwrap_or(0);
    match got {
        None => assert_eq!(best, 0, "{s:?}: nothing chosen from {q:?}"),
        // Ties go to the first of zstd, gzip, br.
        Some(c) => {
            let want = q.iter().find(|(_, v)| *v == best).map(|(n, _)| *n);
            assert!(best > 0, "{s:?}: {c} chosen from {q:?}");
            assert_eq!(Some(c), want, "{s:?}: {q:?}");
        }
    }
});

//! Tokens of the pattern text, each with its line and column.

use super::CepError;

/// Where a token starts: 1-based line and column (in characters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Position {
    /// The line, from 1.
    pub line: usize,
    /// The column, from 1, counted in characters.
    pub column: usize,
}

/// What a token is.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    /// A bare name (keywords are names too; the parser tells them apart).
    Ident(String),
    /// A name in double quotes: never a keyword.
    Quoted(String),
    /// A number, with its text (quantifier counts and durations need integers).
    Number(f64, String),
    /// A string in single quotes.
    Str(String),
    /// Punctuation and operators: `( ) { } [ ] , . ~ ! ? + * - / % = != <> < <= > >=`.
    Punct(&'static str),
    /// The end of the text.
    End,
}

/// A token with its position.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Token {
    pub(crate) tok: Tok,
    pub(crate) at: Position,
}

impl Tok {
    /// The token as an error message names it.
    pub(crate) fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("'{s}'"),
            Tok::Quoted(s) => format!("\"{s}\""),
            Tok::Number(_, text) => text.clone(),
            Tok::Str(s) => format!("the string '{s}'"),
            Tok::Punct(p) => format!("'{p}'"),
            Tok::End => "the end of the text".to_owned(),
        }
    }
}

// Two-character operators first, so that `!=` is not read as `!` then `=`.
const PUNCT: [&str; 23] = [
    "!=", "<>", "<=", ">=", "(", ")", "{", "}", "[", "]", ",", ".", "~", "!", "?", "+", "*", "-", "/", "%", "=", "<",
    ">",
];

/// Splits `text` into tokens; comments run from `--` to the end of the line.
pub(crate) fn tokenize(text: &str) -> Result<Vec<Token>, CepError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line, mut column) = (0, 1, 1);
    let advance = |i: &mut usize, line: &mut usize, column: &mut usize, n: usize| {
        for _ in 0..n {
            if chars[*i] == '\n' {
                *line += 1;
                *column = 1;
            } else {
                *column += 1;
            }
            *i += 1;
        }
    };
    while i < chars.len() {
        let c = chars[i];
        let at = Position { line, column };
        if c.is_whitespace() {
            advance(&mut i, &mut line, &mut column, 1);
            continue;
        }
        if c == '-' && chars.get(i + 1) == Some(&'-') {
            while i < chars.len() && chars[i] != '\n' {
                advance(&mut i, &mut line, &mut column, 1);
            }
            continue;
        }
        let start = i;
        let tok = if c.is_alphabetic() || c == '_' {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                advance(&mut i, &mut line, &mut column, 1);
            }
            Tok::Ident(chars[start..i].iter().collect())
        } else if c.is_ascii_digit() {
            while i < chars.len() && chars[i].is_ascii_digit() {
                advance(&mut i, &mut line, &mut column, 1);
            }
            if chars.get(i) == Some(&'.') && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()) {
                advance(&mut i, &mut line, &mut column, 1);
                while i < chars.len() && chars[i].is_ascii_digit() {
                    advance(&mut i, &mut line, &mut column, 1);
                }
            }
            if matches!(chars.get(i), Some('e' | 'E'))
                && (chars.get(i + 1).is_some_and(|d| d.is_ascii_digit())
                    || (matches!(chars.get(i + 1), Some('+' | '-'))
                        && chars.get(i + 2).is_some_and(|d| d.is_ascii_digit())))
            {
                advance(&mut i, &mut line, &mut column, 2);
                while i < chars.len() && chars[i].is_ascii_digit() {
                    advance(&mut i, &mut line, &mut column, 1);
                }
            }
            let text: String = chars[start..i].iter().collect();
            let value = text.parse::<f64>().map_err(|_| CepError::syntax(at, format!("invalid number {text}")))?;
            Tok::Number(value, text)
        } else if c == '\'' || c == '"' {
            let mut s = String::new();
            advance(&mut i, &mut line, &mut column, 1);
            loop {
                match chars.get(i) {
                    None => {
                        let what = if c == '\'' { "string" } else { "quoted name" };
                        return Err(CepError::syntax(
                            at,
                            format!("this {what} is not closed: expected {c} before the end of the text"),
                        ));
                    }
                    // Doubling the quote escapes it, as in SQL.
                    Some(&q) if q == c && chars.get(i + 1) == Some(&c) => {
                        s.push(c);
                        advance(&mut i, &mut line, &mut column, 2);
                    }
                    Some(&q) if q == c => {
                        advance(&mut i, &mut line, &mut column, 1);
                        break;
                    }
                    Some(&other) => {
                        s.push(other);
                        advance(&mut i, &mut line, &mut column, 1);
                    }
                }
            }
            if c == '\'' {
                Tok::Str(s)
            } else {
                Tok::Quoted(s)
            }
        } else if let Some(p) =
            PUNCT.iter().find(|p| p.chars().enumerate().all(|(k, pc)| chars.get(i + k) == Some(&pc)))
        {
            advance(&mut i, &mut line, &mut column, p.chars().count());
            Tok::Punct(p)
        } else {
            return Err(CepError::syntax(at, format!("unexpected character '{c}'")));
        };
        out.push(Token { tok, at });
    }
    out.push(Token { tok: Tok::End, at: Position { line, column } });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_and_kinds() {
        let toks = tokenize("PATTERN (a+? b)\n  -- note\n  WITHIN 60s 'it''s' != 1.5e3").unwrap();
        let kinds: Vec<Tok> = toks.iter().map(|t| t.tok.clone()).collect();
        assert_eq!(kinds[0], Tok::Ident("PATTERN".into()));
        assert_eq!(kinds[3], Tok::Punct("+"));
        assert_eq!(kinds[4], Tok::Punct("?"));
        let within = toks.iter().find(|t| t.tok == Tok::Ident("WITHIN".into())).unwrap();
        assert_eq!(within.at, Position { line: 3, column: 3 });
        assert!(kinds.contains(&Tok::Str("it's".into())));
        assert!(kinds.contains(&Tok::Number(1500.0, "1.5e3".into())));
    }

    #[test]
    fn unclosed_string() {
        let e = tokenize("DEFINE a AS x = 'abc").unwrap_err().to_string();
        assert_eq!(e, "line 1, column 17: this string is not closed: expected ' before the end of the text");
    }
}

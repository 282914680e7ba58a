//! CEP pattern texts and field paths.

use std::fmt::Write;

use highwater_operators::cep::{Contiguity, Greed};
use serde_json::Value;

use super::Outcome;
use crate::cep::expr::{ArithOp, CmpOp, Expr, Subject};
use crate::cep::parser::{parse, Link, Program, Skip};
use crate::cep::{compile, CepError, FieldPath, Position, Segment};

/// A CEP pattern text, and JSON events to test its conditions on.
///
/// The input is the text, then optionally a NUL byte and JSON events, one a
/// line. The text is parsed as a whole program ([`compile`]) and as a field
/// path ([`FieldPath::parse`]). Checks that an error's position lies in the
/// text; that a parsed program, written back as text, parses to the same
/// program (positions aside) and a path to the same path; that `compile`
/// fails where parsing fails, with the same error; and that a compiled
/// program builds a valid pattern whose conditions evaluate on the events.
/// Accepted if the text compiles or is a path.
pub fn cep(data: &[u8]) -> Outcome {
    let (text, events) = match data.iter().position(|b| *b == 0) {
        Some(nul) => (&data[..nul], &data[nul + 1..]),
        None => (data, &[][..]),
    };
    let text = String::from_utf8_lossy(text);
    let events: Vec<Value> = events.split(|b| *b == b'\n').filter_map(|l| serde_json::from_slice(l).ok()).collect();

    let path = FieldPath::parse(&text);
    match &path {
        Ok(path) => {
            let shown = path.to_string();
            assert_eq!(FieldPath::parse(&shown).as_ref(), Ok(path), "path {text:?} written as {shown:?}");
            for event in &events {
                let _ = path.get(event);
            }
        }
        Err(e) => check_position(&text, e),
    }

    let compiled = compile(&text);
    match parse(&text) {
        Ok(program) => {
            let shown = program_text(&program);
            match parse(&shown) {
                Ok(again) => assert_eq!(
                    without_positions(again),
                    without_positions(program),
                    "{text:?} written back as {shown:?} parses differently"
                ),
                Err(e) => panic!("{text:?} written back as {shown:?} does not parse: {e}"),
            }
        }
        Err(e) => {
            check_position(&text, &e);
            assert_eq!(compiled.as_ref().err(), Some(&e), "compile and parse disagree");
        }
    }
    match &compiled {
        Ok(program) => {
            let pattern = program.pattern();
            assert!(pattern.validate().is_ok(), "a compiled pattern does not validate");
            let steps = program.step_names();
            // Each event tested against each step, after the events before it
            // were taken by the steps in turn.
            let mut taken: Vec<(&str, Value)> = Vec::new();
            for (i, event) in events.iter().enumerate() {
                for step in &steps {
                    assert!(program.holds(step, event, &taken).is_some(), "step {step} is missing");
                }
                taken.push((steps[i % steps.len()], event.clone()));
            }
        }
        Err(e) => check_position(&text, e),
    }
    if path.is_ok() {
        Outcome::Accepted
    } else {
        Outcome::from(&compiled)
    }
}

/// An error's position is a character of the text, or just past its last one.
fn check_position(text: &str, e: &CepError) {
    let Some(Position { line, column }) = e.position() else { return };
    let lines: Vec<&str> = text.split('\n').collect();
    assert!(line >= 1 && line <= lines.len(), "{e}: line {line} of {}", lines.len());
    let chars = lines[line - 1].chars().count();
    assert!(column >= 1 && column <= chars + 1, "{e}: column {column} of a line of {chars} characters");
}

fn without_positions(mut p: Program) -> Program {
    let zero = Position::default();
    if let Some((steps, at)) = &mut p.pattern {
        *at = zero;
        for s in steps {
            s.at = zero;
            s.link_at = zero;
            if let Some(q) = &mut s.quantifier {
                q.at = zero;
            }
            if let Some((_, at)) = &mut s.inner {
                *at = zero;
            }
        }
    }
    if let Some((_, at)) = &mut p.within {
        *at = zero;
    }
    if let Some((skip, at)) = &mut p.skip {
        *at = zero;
        if let Skip::ToFirst(_, at) | Skip::ToLast(_, at) = skip {
            *at = zero;
        }
    }
    for d in &mut p.defines {
        d.at = zero;
        for (_, at) in &mut d.refs {
            *at = zero;
        }
    }
    p
}

/// A name in double quotes: never a keyword.
fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The program as text that parses back to it.
fn program_text(p: &Program) -> String {
    let mut out = String::new();
    if let Some((steps, _)) = &p.pattern {
        out.push_str("PATTERN (");
        for (i, s) in steps.iter().enumerate() {
            if i > 0 {
                out.push_str(match s.link {
                    Link::Relaxed => " ",
                    Link::Strict => " . ",
                    Link::Any => " ~ ",
                });
            }
            if s.negated {
                out.push('!');
            }
            out.push_str(&quote(&s.name));
            if let Some(q) = &s.quantifier {
                match q.max {
                    Some(max) => write!(out, "{{{},{max}}}", q.min),
                    None => write!(out, "{{{},}}", q.min),
                }
                .expect("writing to a String");
                out.push_str(match q.greed {
                    Greed::Both => "",
                    Greed::Greedy => "+",
                    Greed::Reluctant => "?",
                });
            }
            match s.inner {
                Some((Contiguity::Strict, _)) => out.push_str(" CONSECUTIVE"),
                Some((Contiguity::NonDeterministic, _)) => out.push_str(" COMBINATIONS"),
                Some((Contiguity::Relaxed, _)) | None => {}
            }
        }
        out.push_str(")\n");
    }
    if let Some((ms, _)) = p.within {
        writeln!(out, "WITHIN {ms}ms").expect("writing to a String");
    }
    if let Some((skip, _)) = &p.skip {
        out.push_str("AFTER MATCH SKIP ");
        match skip {
            Skip::None => out.push_str("NONE"),
            Skip::PastLastRow => out.push_str("PAST LAST ROW"),
            Skip::ToNextRow => out.push_str("TO NEXT ROW"),
            Skip::ToFirst(name, _) => write!(out, "TO FIRST {}", quote(name)).expect("writing to a String"),
            Skip::ToLast(name, _) => write!(out, "TO LAST {}", quote(name)).expect("writing to a String"),
        }
        out.push('\n');
    }
    for (i, d) in p.defines.iter().enumerate() {
        out.push_str(if i == 0 { "DEFINE " } else { ",\n       " });
        write!(out, "{} AS {}", quote(&d.name), expr_text(&d.expr, 1)).expect("writing to a String");
    }
    out
}

/// How tightly an expression binds (the grammar's levels: or, and, not,
/// predicate, sum, product, unary, primary).
fn precedence(e: &Expr) -> u8 {
    match e {
        Expr::Or(..) => 1,
        Expr::And(..) => 2,
        Expr::Not(_) => 3,
        Expr::Cmp(..) | Expr::In { .. } | Expr::IsNull { .. } => 4,
        Expr::Arith(ArithOp::Add | ArithOp::Sub, ..) => 5,
        Expr::Arith(..) => 6,
        Expr::Neg(_) => 7,
        Expr::Lit(_) | Expr::Field(..) | Expr::Count(_) => 8,
    }
}

/// `e` as text, in parentheses if it binds less tightly than `min`
/// (parentheses only where the tree needs them, so that writing a program
/// back does not nest deeper than its text did).
fn expr_text(e: &Expr, min: u8) -> String {
    let text = match e {
        Expr::Lit(Value::Null) => "NULL".to_owned(),
        Expr::Lit(Value::Bool(b)) => if *b { "TRUE" } else { "FALSE" }.to_owned(),
        Expr::Lit(Value::Number(n)) => n.to_string(),
        Expr::Lit(Value::String(s)) => format!("'{}'", s.replace('\'', "''")),
        Expr::Lit(other) => panic!("the parser made a literal {other}"),
        Expr::Field(subject, path) => {
            let mut text = match subject {
                Subject::Event => String::new(),
                Subject::First(step) => format!("FIRST({})", quote(step)),
                Subject::Last(step) => format!("LAST({})", quote(step)),
                Subject::Prev => "PREV".to_owned(),
            };
            for (i, segment) in path.0.iter().enumerate() {
                match segment {
                    Segment::Key(k) if i == 0 && *subject == Subject::Event => text.push_str(&quote(k)),
                    Segment::Key(k) => write!(text, ".{}", quote(k)).expect("writing to a String"),
                    Segment::Index(n) => write!(text, "[{n}]").expect("writing to a String"),
                }
            }
            text
        }
        Expr::Count(step) => format!("COUNT({})", quote(step)),
        // A space, so that `- -x` is not a comment.
        Expr::Neg(inner) => format!("- {}", expr_text(inner, 7)),
        Expr::Arith(op, a, b) => {
            let (symbol, level) = match op {
                ArithOp::Add => ("+", 5),
                ArithOp::Sub => ("-", 5),
                ArithOp::Mul => ("*", 6),
                ArithOp::Div => ("/", 6),
                ArithOp::Rem => ("%", 6),
            };
            format!("{} {symbol} {}", expr_text(a, level), expr_text(b, level + 1))
        }
        Expr::Cmp(op, a, b) => {
            let symbol = match op {
                CmpOp::Eq => "=",
                CmpOp::Ne => "!=",
                CmpOp::Lt => "<",
                CmpOp::Le => "<=",
                CmpOp::Gt => ">",
                CmpOp::Ge => ">=",
            };
            format!("{} {symbol} {}", expr_text(a, 5), expr_text(b, 5))
        }
        Expr::In { expr, list, negated } => {
            let list: Vec<String> = list.iter().map(|e| expr_text(e, 5)).collect();
            format!("{} {}IN ({})", expr_text(expr, 5), if *negated { "NOT " } else { "" }, list.join(", "))
        }
        Expr::IsNull { expr, negated } => {
            format!("{} IS {}NULL", expr_text(expr, 5), if *negated { "NOT " } else { "" })
        }
        Expr::Not(inner) => format!("NOT {}", expr_text(inner, 3)),
        Expr::And(a, b) => format!("{} AND {}", expr_text(a, 2), expr_text(b, 3)),
        Expr::Or(a, b) => format!("{} OR {}", expr_text(a, 1), expr_text(b, 2)),
    };
    if precedence(e) < min {
        format!("({text})")
    } else {
        text
    }
}

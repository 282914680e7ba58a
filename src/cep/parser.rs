//! The parser: tokens to the clauses of a pattern text (see the grammar in
//! the [module documentation](super)).

use highwater_operators::cep::{Contiguity, Greed};
use serde_json::Value;

use super::expr::{ArithOp, CmpOp, Expr, FieldPath, Segment, Subject};
use super::lexer::{tokenize, Position, Tok, Token};
use super::CepError;

/// How a step follows the one before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Link {
    /// `a b`: relaxed (`followed_by`, `not_followed_by`).
    Relaxed,
    /// `a . b`: strict (`next`, `not_next`).
    Strict,
    /// `a ~ b`: non-deterministic relaxed (`followed_by_any`).
    Any,
}

/// A quantifier: `?`, `+`, `*`, `{n}`, `{n,m}`, `{n,}`, with its greed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Quantifier {
    pub(crate) min: u32,
    pub(crate) max: Option<u32>,
    pub(crate) greed: Greed,
    pub(crate) at: Position,
}

/// One step of PATTERN.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Element {
    pub(crate) name: String,
    pub(crate) at: Position,
    pub(crate) link: Link,
    pub(crate) link_at: Position,
    pub(crate) negated: bool,
    pub(crate) quantifier: Option<Quantifier>,
    pub(crate) inner: Option<(Contiguity, Position)>,
}

/// AFTER MATCH SKIP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Skip {
    None,
    PastLastRow,
    ToNextRow,
    ToFirst(String, Position),
    ToLast(String, Position),
}

/// One DEFINE entry, with the step references of its condition.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Define {
    pub(crate) name: String,
    pub(crate) at: Position,
    pub(crate) expr: Expr,
    pub(crate) refs: Vec<(String, Position)>,
}

/// The clauses of a pattern text.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Program {
    pub(crate) pattern: Option<(Vec<Element>, Position)>,
    pub(crate) within: Option<(u64, Position)>,
    pub(crate) skip: Option<(Skip, Position)>,
    pub(crate) defines: Vec<Define>,
}

/// How deeply parentheses, `NOT` and unary `-` may nest in a condition: the
/// parser recurses on each, and a text must not be able to overflow its stack.
pub(crate) const MAX_NESTING: usize = 64;

/// The deepest expression tree a condition may make (a chain such as
/// `a OR b OR c` is as deep as it is long): conditions are evaluated, cloned
/// and dropped recursively, on the workers' stacks.
pub(crate) const MAX_DEPTH: usize = 1_000;

/// Words that cannot be bare field names in conditions (quote them: `"in"`).
const RESERVED: [&str; 9] = ["AND", "OR", "NOT", "IN", "IS", "TRUE", "FALSE", "NULL", "PREV"];

/// Parses a whole pattern text.
pub(crate) fn parse(text: &str) -> Result<Program, CepError> {
    let mut p = Parser { toks: tokenize(text)?, pos: 0, refs: Vec::new(), nesting: 0 };
    p.program()
}

/// Parses a field path alone (`user.id`, `items[0]`).
pub(crate) fn parse_path(text: &str) -> Result<FieldPath, CepError> {
    let mut p = Parser { toks: tokenize(text)?, pos: 0, refs: Vec::new(), nesting: 0 };
    let (first, _) = p.name("a field name")?;
    let path = p.path_tail(vec![Segment::Key(first)])?;
    if p.peek().tok != Tok::End {
        return p.expected("'.', '[' or the end of the path");
    }
    Ok(path)
}

struct Parser {
    toks: Vec<Token>,
    pos: usize,
    /// Step references met in the condition being parsed.
    refs: Vec<(String, Position)>,
    /// Parentheses, `NOT`s and unary `-`s open around the next token.
    nesting: usize,
}

impl Parser {
    fn peek(&self) -> &Token {
        &self.toks[self.pos]
    }

    fn peek_at(&self, n: usize) -> &Tok {
        self.toks.get(self.pos + n).map_or(&Tok::End, |t| &t.tok)
    }

    fn at(&self) -> Position {
        self.peek().at
    }

    fn bump(&mut self) -> Token {
        let t = self.toks[self.pos].clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn is_kw(&self, kw: &str) -> bool {
        matches!(&self.peek().tok, Tok::Ident(s) if s.eq_ignore_ascii_case(kw))
    }

    fn is_punct(&self, p: &str) -> bool {
        matches!(&self.peek().tok, Tok::Punct(q) if *q == p)
    }

    fn eat_kw(&mut self, kw: &str) -> bool {
        let yes = self.is_kw(kw);
        if yes {
            self.bump();
        }
        yes
    }

    fn eat_punct(&mut self, p: &str) -> bool {
        let yes = self.is_punct(p);
        if yes {
            self.bump();
        }
        yes
    }

    /// An error at the next token: what was expected after the previous one.
    fn expected<T>(&self, what: &str) -> Result<T, CepError> {
        let t = self.peek();
        let after = match self.pos.checked_sub(1) {
            Some(prev) => format!(" after {}", self.toks[prev].tok.describe()),
            None => String::new(),
        };
        Err(CepError::syntax(t.at, format!("expected {what}{after}, found {}", t.tok.describe())))
    }

    fn expect_kw(&mut self, kw: &str) -> Result<(), CepError> {
        if self.eat_kw(kw) {
            Ok(())
        } else {
            self.expected(kw)
        }
    }

    fn expect_punct(&mut self, p: &str) -> Result<(), CepError> {
        if self.eat_punct(p) {
            Ok(())
        } else {
            self.expected(&format!("'{p}'"))
        }
    }

    fn is_name(&self) -> bool {
        matches!(self.peek().tok, Tok::Ident(_) | Tok::Quoted(_))
    }

    /// A name: an identifier or a name in double quotes.
    fn name(&mut self, what: &str) -> Result<(String, Position), CepError> {
        match &self.peek().tok {
            Tok::Ident(s) | Tok::Quoted(s) => {
                let s = s.clone();
                Ok((s, self.bump().at))
            }
            _ => self.expected(what),
        }
    }

    /// A whole number that fits a quantifier count.
    fn count(&mut self, what: &str) -> Result<u32, CepError> {
        match &self.peek().tok {
            Tok::Number(_, text) if text.bytes().all(|b| b.is_ascii_digit()) => {
                let n = text.parse::<u32>().map_err(|_| CepError::syntax(self.at(), format!("{text} is too large")))?;
                self.bump();
                Ok(n)
            }
            _ => self.expected(what),
        }
    }

    fn program(&mut self) -> Result<Program, CepError> {
        let mut program = Program::default();
        let mut after_define = false;
        loop {
            let at = self.at();
            let twice = |clause: &str| Err(CepError::invalid(at, format!("{clause} is given twice")));
            if self.peek().tok == Tok::End {
                break;
            } else if self.is_kw("PATTERN") {
                if program.pattern.is_some() {
                    return twice("PATTERN");
                }
                program.pattern = Some((self.pattern()?, at));
            } else if self.is_kw("WITHIN") {
                if program.within.is_some() {
                    return twice("WITHIN");
                }
                program.within = Some((self.within()?, at));
            } else if self.is_kw("AFTER") {
                if program.skip.is_some() {
                    return twice("AFTER MATCH SKIP");
                }
                program.skip = Some((self.skip()?, at));
            } else if self.is_kw("DEFINE") {
                self.bump();
                self.defines(&mut program.defines)?;
                after_define = true;
                continue;
            } else if after_define {
                return self.expected("',' or a clause (PATTERN, WITHIN, AFTER MATCH SKIP, DEFINE)");
            } else {
                return self.expected("a clause (PATTERN, WITHIN, AFTER MATCH SKIP, DEFINE)");
            }
            after_define = false;
        }
        Ok(program)
    }

    fn pattern(&mut self) -> Result<Vec<Element>, CepError> {
        self.bump();
        self.expect_punct("(")?;
        let mut elements: Vec<Element> = Vec::new();
        loop {
            let link_at = self.at();
            let link = if elements.is_empty() {
                Link::Relaxed
            } else if self.eat_punct(".") {
                Link::Strict
            } else if self.eat_punct("~") {
                Link::Any
            } else {
                Link::Relaxed
            };
            let negated = self.eat_punct("!");
            if self.is_punct("(") {
                return Err(CepError::syntax(
                    self.at(),
                    "groups are not supported in PATTERN: expected a step name, found '('".to_owned(),
                ));
            }
            if self.is_kw("CONSECUTIVE") || self.is_kw("COMBINATIONS") {
                return self.expected("a step name (CONSECUTIVE and COMBINATIONS follow a quantifier, as in a+ CONSECUTIVE; to name a step so, quote it)");
            }
            let (name, at) = self.name("a step name")?;
            let quantifier = self.quantifier()?;
            let inner_at = self.at();
            let inner = if self.eat_kw("CONSECUTIVE") {
                Some((Contiguity::Strict, inner_at))
            } else if self.eat_kw("COMBINATIONS") {
                Some((Contiguity::NonDeterministic, inner_at))
            } else {
                None
            };
            elements.push(Element { name, at, link, link_at, negated, quantifier, inner });
            if self.eat_punct(")") {
                return Ok(elements);
            }
            let next = ["(", ".", "~", "!"].iter().any(|p| self.is_punct(p));
            if !(self.is_name() || next) {
                return self.expected("a step name, '.', '~', '!' or ')'");
            }
        }
    }

    fn quantifier(&mut self) -> Result<Option<Quantifier>, CepError> {
        let at = self.at();
        let (min, max) = if self.eat_punct("?") {
            (0, Some(1))
        } else if self.eat_punct("+") {
            (1, None)
        } else if self.eat_punct("*") {
            (0, None)
        } else if self.eat_punct("{") {
            let n = self.count("a whole number")?;
            let bounds = if self.eat_punct("}") {
                (n, Some(n))
            } else {
                self.expect_punct(",")?;
                if self.eat_punct("}") {
                    (n, None)
                } else {
                    let m = self.count("a whole number or '}'")?;
                    self.expect_punct("}")?;
                    (n, Some(m))
                }
            };
            match bounds {
                (n, Some(m)) if m < n => {
                    return Err(CepError::invalid(at, format!("the maximum count {m} is less than the minimum {n}")));
                }
                (_, Some(0)) => {
                    return Err(CepError::invalid(at, "a step must take at least one event: {0} never matches".into()));
                }
                _ => {}
            }
            bounds
        } else {
            return Ok(None);
        };
        let greed = if self.eat_punct("?") {
            Greed::Reluctant
        } else if self.eat_punct("+") {
            Greed::Greedy
        } else {
            Greed::Both
        };
        Ok(Some(Quantifier { min, max, greed, at }))
    }

    fn within(&mut self) -> Result<u64, CepError> {
        self.bump();
        let at = self.at();
        let Tok::Number(value, text) = self.peek().tok.clone() else {
            return self.expected("a duration such as 60s, 5m or 250ms");
        };
        self.bump();
        let unit = match &self.peek().tok {
            Tok::Ident(u) => u.to_ascii_lowercase(),
            _ => return self.expected("a unit (ms, s, m, min, h or d)"),
        };
        let scale = match unit.as_str() {
            "ms" | "millisecond" | "milliseconds" => 1.0,
            "s" | "sec" | "second" | "seconds" => 1e3,
            "m" | "min" | "minute" | "minutes" => 60e3,
            "h" | "hour" | "hours" => 3600e3,
            "d" | "day" | "days" => 86_400e3,
            _ => return self.expected("a unit (ms, s, m, min, h or d)"),
        };
        self.bump();
        let ms = value * scale;
        if ms < 1.0 || ms.fract() != 0.0 || ms > u64::MAX as f64 {
            return Err(CepError::invalid(
                at,
                format!("WITHIN {text}{unit} is not a positive whole number of milliseconds"),
            ));
        }
        Ok(ms as u64)
    }

    fn skip(&mut self) -> Result<Skip, CepError> {
        self.bump();
        self.expect_kw("MATCH")?;
        self.expect_kw("SKIP")?;
        if self.eat_kw("PAST") {
            self.expect_kw("LAST")?;
            self.expect_kw("ROW")?;
            return Ok(Skip::PastLastRow);
        }
        if self.eat_kw("NONE") {
            return Ok(Skip::None);
        }
        if !self.eat_kw("TO") {
            return self.expected("PAST LAST ROW, TO NEXT ROW, TO FIRST step, TO LAST step or NONE");
        }
        if self.is_kw("NEXT") && matches!(self.peek_at(1), Tok::Ident(r) if r.eq_ignore_ascii_case("ROW")) {
            self.bump();
            self.bump();
            return Ok(Skip::ToNextRow);
        }
        let first = self.is_kw("FIRST") && matches!(self.peek_at(1), Tok::Ident(_) | Tok::Quoted(_));
        let last = self.is_kw("LAST") && matches!(self.peek_at(1), Tok::Ident(_) | Tok::Quoted(_));
        if first || last {
            self.bump();
        }
        let (name, at) = self.name("NEXT ROW, FIRST step, LAST step or a step name")?;
        Ok(if first { Skip::ToFirst(name, at) } else { Skip::ToLast(name, at) })
    }

    fn defines(&mut self, out: &mut Vec<Define>) -> Result<(), CepError> {
        loop {
            let (name, at) = self.name("a step name")?;
            self.expect_kw("AS")?;
            self.refs.clear();
            let expr_at = self.at();
            let expr = self.expr()?;
            if !expr.is_condition() {
                return Err(CepError::invalid(
                    expr_at,
                    format!(
                        "the condition of step '{name}' is {}: expected something true or false (a comparison, IN, IS NULL, AND, OR, NOT)",
                        expr.describe()
                    ),
                ));
            }
            out.push(Define { name, at, expr, refs: std::mem::take(&mut self.refs) });
            if self.eat_punct(",") {
                continue;
            }
            if self.is_name() && matches!(self.peek_at(1), Tok::Ident(s) if s.eq_ignore_ascii_case("AS")) {
                return self.expected("',' between two definitions");
            }
            return Ok(());
        }
    }

    /// Parses `inner` one nesting level deeper (after `(`, `NOT` or unary `-`
    /// at `at`), at most [`MAX_NESTING`] deep.
    fn nested(
        &mut self,
        at: Position,
        inner: impl FnOnce(&mut Self) -> Result<Expr, CepError>,
    ) -> Result<Expr, CepError> {
        if self.nesting >= MAX_NESTING {
            return Err(CepError::invalid(
                at,
                format!("the condition nests more than {MAX_NESTING} parentheses, NOTs and minus signs"),
            ));
        }
        self.nesting += 1;
        let e = inner(self);
        self.nesting -= 1;
        e
    }

    /// `e`, a new node of an expression at `at`, if its tree is at most [`MAX_DEPTH`] deep.
    fn node(&self, e: Expr, at: Position) -> Result<Expr, CepError> {
        if e.depth() > MAX_DEPTH {
            return Err(CepError::invalid(
                at,
                format!(
                    "the condition is more than {MAX_DEPTH} operations deep (a list of alternatives is shorter with IN)"
                ),
            ));
        }
        Ok(e)
    }

    /// Checks that an operand of AND, OR or NOT is a condition.
    fn condition(&self, e: Expr, at: Position, op: &str) -> Result<Expr, CepError> {
        if e.is_condition() {
            Ok(e)
        } else {
            Err(CepError::invalid(at, format!("{op} needs conditions on both sides, found {}", e.describe())))
        }
    }

    fn expr(&mut self) -> Result<Expr, CepError> {
        let at = self.at();
        let mut left = self.and()?;
        while self.eat_kw("OR") {
            left = self.condition(left, at, "OR")?;
            let right_at = self.at();
            let right = self.and()?;
            let right = self.condition(right, right_at, "OR")?;
            left = self.node(Expr::Or(Box::new(left), Box::new(right)), at)?;
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, CepError> {
        let at = self.at();
        let mut left = self.not()?;
        while self.eat_kw("AND") {
            left = self.condition(left, at, "AND")?;
            let right_at = self.at();
            let right = self.not()?;
            let right = self.condition(right, right_at, "AND")?;
            left = self.node(Expr::And(Box::new(left), Box::new(right)), at)?;
        }
        Ok(left)
    }

    fn not(&mut self) -> Result<Expr, CepError> {
        let not_at = self.at();
        if self.eat_kw("NOT") {
            let at = self.at();
            let e = self.nested(not_at, Self::not)?;
            let e = Expr::Not(Box::new(self.condition(e, at, "NOT")?));
            return self.node(e, not_at);
        }
        self.predicate()
    }

    fn cmp_op(&self) -> Option<CmpOp> {
        match self.peek().tok {
            Tok::Punct("=") => Some(CmpOp::Eq),
            Tok::Punct("!=" | "<>") => Some(CmpOp::Ne),
            Tok::Punct("<") => Some(CmpOp::Lt),
            Tok::Punct("<=") => Some(CmpOp::Le),
            Tok::Punct(">") => Some(CmpOp::Gt),
            Tok::Punct(">=") => Some(CmpOp::Ge),
            _ => None,
        }
    }

    fn predicate(&mut self) -> Result<Expr, CepError> {
        let at = self.at();
        let left = self.sum()?;
        if let Some(op) = self.cmp_op() {
            self.bump();
            let right = self.sum()?;
            if self.cmp_op().is_some() {
                return Err(CepError::syntax(
                    self.at(),
                    format!("comparisons cannot be chained: join them with AND (found {})", self.peek().tok.describe()),
                ));
            }
            return self.node(Expr::Cmp(op, Box::new(left), Box::new(right)), at);
        }
        let not_in = self.is_kw("NOT") && matches!(self.peek_at(1), Tok::Ident(s) if s.eq_ignore_ascii_case("IN"));
        if not_in || self.is_kw("IN") {
            if not_in {
                self.bump();
            }
            self.bump();
            self.expect_punct("(")?;
            let mut list = vec![self.sum()?];
            while self.eat_punct(",") {
                list.push(self.sum()?);
            }
            self.expect_punct(")")?;
            return self.node(Expr::In { expr: Box::new(left), list, negated: not_in }, at);
        }
        if self.eat_kw("IS") {
            let negated = self.eat_kw("NOT");
            self.expect_kw("NULL")?;
            return self.node(Expr::IsNull { expr: Box::new(left), negated }, at);
        }
        Ok(left)
    }

    fn sum(&mut self) -> Result<Expr, CepError> {
        let at = self.at();
        let mut left = self.product()?;
        loop {
            let op = match self.peek().tok {
                Tok::Punct("+") => ArithOp::Add,
                Tok::Punct("-") => ArithOp::Sub,
                _ => return Ok(left),
            };
            self.bump();
            let right = self.product()?;
            left = self.node(Expr::Arith(op, Box::new(left), Box::new(right)), at)?;
        }
    }

    fn product(&mut self) -> Result<Expr, CepError> {
        let at = self.at();
        let mut left = self.unary()?;
        loop {
            let op = match self.peek().tok {
                Tok::Punct("*") => ArithOp::Mul,
                Tok::Punct("/") => ArithOp::Div,
                Tok::Punct("%") => ArithOp::Rem,
                _ => return Ok(left),
            };
            self.bump();
            let right = self.unary()?;
            left = self.node(Expr::Arith(op, Box::new(left), Box::new(right)), at)?;
        }
    }

    fn unary(&mut self) -> Result<Expr, CepError> {
        let at = self.at();
        if self.eat_punct("-") {
            return match self.nested(at, Self::unary)? {
                Expr::Lit(Value::Number(n)) => Ok(Expr::Lit(negate(&n))),
                e => self.node(Expr::Neg(Box::new(e)), at),
            };
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Expr, CepError> {
        let token = self.peek().clone();
        match &token.tok {
            Tok::Number(value, text) => {
                self.bump();
                let n = text
                    .parse::<u64>()
                    .map(serde_json::Number::from)
                    .ok()
                    .or_else(|| serde_json::Number::from_f64(*value))
                    .ok_or_else(|| CepError::syntax(token.at, format!("invalid number {text}")))?;
                Ok(Expr::Lit(Value::Number(n)))
            }
            Tok::Str(s) => {
                self.bump();
                Ok(Expr::Lit(Value::String(s.clone())))
            }
            Tok::Punct("(") => {
                self.bump();
                let e = self.nested(token.at, Self::expr)?;
                self.expect_punct(")")?;
                Ok(e)
            }
            Tok::Ident(word) => {
                let upper = word.to_ascii_uppercase();
                let call = matches!(self.peek_at(1), Tok::Punct("("));
                match upper.as_str() {
                    "TRUE" | "FALSE" => {
                        self.bump();
                        Ok(Expr::Lit(Value::Bool(upper == "TRUE")))
                    }
                    "NULL" => {
                        self.bump();
                        Ok(Expr::Lit(Value::Null))
                    }
                    "PREV" => {
                        self.bump();
                        Ok(Expr::Field(Subject::Prev, self.path_tail(Vec::new())?))
                    }
                    "FIRST" | "LAST" | "COUNT" if call => {
                        self.bump();
                        self.bump();
                        let (step, at) = self.name("a step name")?;
                        self.expect_punct(")")?;
                        self.refs.push((step.clone(), at));
                        Ok(match upper.as_str() {
                            "COUNT" => Expr::Count(step),
                            "FIRST" => Expr::Field(Subject::First(step), self.path_tail(Vec::new())?),
                            _ => Expr::Field(Subject::Last(step), self.path_tail(Vec::new())?),
                        })
                    }
                    w if RESERVED.contains(&w) => {
                        self.expected("a value (a field, a literal, first(step).field, last(step).field, prev.field, count(step) or '(')")
                    }
                    _ => self.field(),
                }
            }
            Tok::Quoted(_) => self.field(),
            _ => self.expected(
                "a value (a field, a literal, first(step).field, last(step).field, prev.field, count(step) or '(')",
            ),
        }
    }

    fn field(&mut self) -> Result<Expr, CepError> {
        let (first, _) = self.name("a field name")?;
        Ok(Expr::Field(Subject::Event, self.path_tail(vec![Segment::Key(first)])?))
    }

    /// `.name` and `[index]` segments after a path's start.
    fn path_tail(&mut self, mut segments: Vec<Segment>) -> Result<FieldPath, CepError> {
        loop {
            if self.eat_punct(".") {
                let (name, _) = self.name("a field name")?;
                segments.push(Segment::Key(name));
            } else if self.eat_punct("[") {
                let n = self.count("an array index")?;
                self.expect_punct("]")?;
                segments.push(Segment::Index(n as usize));
            } else {
                return Ok(FieldPath(segments));
            }
        }
    }
}

fn negate(n: &serde_json::Number) -> Value {
    if let Some(i) = n.as_u64().and_then(|u| i64::try_from(u).ok()) {
        Value::from(-i)
    } else {
        n.as_f64().and_then(|f| serde_json::Number::from_f64(-f)).map_or(Value::Null, Value::Number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(text: &str) -> Result<Program, CepError> {
        parse(&format!("PATTERN (a) DEFINE a AS {text}"))
    }

    // Found by fuzzing (tests/fuzz/cep): deep nesting overflowed the parser's
    // stack, long chains the stacks that evaluate and drop conditions.
    #[test]
    fn nesting_is_bounded() {
        let parens = |n: usize| format!("{}x{}", "(".repeat(n), ")".repeat(n));
        assert!(condition(&parens(MAX_NESTING)).is_ok());
        let err = condition(&parens(MAX_NESTING + 1)).unwrap_err().to_string();
        assert!(err.contains("nests more than 64"), "{err}");
        assert!(condition(&format!("{}x", "NOT ".repeat(MAX_NESTING))).is_ok());
        assert!(condition(&format!("{}x", "NOT ".repeat(MAX_NESTING + 1))).is_err());
        assert!(condition(&format!("{}1 = x", "- ".repeat(MAX_NESTING + 1))).is_err());
        // Unclosed, and far too deep for the stack without the bound.
        assert!(condition(&"(".repeat(100_000)).unwrap_err().to_string().contains("nests more than"));
    }

    #[test]
    fn depth_is_bounded() {
        let chain = |n: usize, op: &str| vec!["x = 1"; n].join(op);
        assert!(condition(&chain(MAX_DEPTH - 1, " OR ")).is_ok());
        let err = condition(&chain(MAX_DEPTH + 1, " OR ")).unwrap_err().to_string();
        assert!(err.contains("more than 1000 operations deep"), "{err}");
        assert!(condition(&chain(100_000, " AND ")).is_err());
        assert!(condition(&format!("{} = 1", vec!["x"; 100_000].join(" + "))).is_err());
        assert!(condition(&format!("{} = 1", vec!["x"; MAX_DEPTH - 1].join(" * "))).is_ok());
        // A wide IN list is shallow.
        let list = (0..10_000).map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
        assert!(condition(&format!("x IN ({list})")).is_ok());
    }
}

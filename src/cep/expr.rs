//! Conditions on JSON events: field paths, references to earlier steps,
//! literals, arithmetic, comparisons and logic, and how they evaluate.

use std::cmp::Ordering;
use std::fmt;

use highwater_operators::cep::Matched;
use serde_json::Value;

use super::{parser, CepError};

/// One step of a [`FieldPath`]: an object member or an array element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    /// An object member, by name.
    Key(String),
    /// An array element, from 0.
    Index(usize),
}

/// A path into a JSON value: `user.country`, `items[0].price`,
/// `"odd name".x` (names that are not plain identifiers, or are keywords,
/// go in double quotes).
///
/// ```
/// use highwater::cep::FieldPath;
/// use serde_json::json;
///
/// let path = FieldPath::parse("user.tags[1]").unwrap();
/// assert_eq!(path.get(&json!({"user": {"tags": ["a", "b"]}})), Some(&json!("b")));
/// assert_eq!(path.get(&json!({"user": {}})), None);
/// assert_eq!(path.to_string(), "user.tags[1]");
/// assert!(FieldPath::parse("user.").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldPath(pub Vec<Segment>);

impl FieldPath {
    /// Parses a path (the same syntax as a field in a DEFINE condition).
    ///
    /// # Errors
    /// If `text` is not a path; the error says where and what was expected.
    pub fn parse(text: &str) -> Result<FieldPath, CepError> {
        parser::parse_path(text)
    }

    /// The value at this path, if there is one.
    pub fn get<'a>(&self, value: &'a Value) -> Option<&'a Value> {
        self.0.iter().try_fold(value, |v, segment| match segment {
            Segment::Key(k) => v.get(k.as_str()),
            Segment::Index(i) => v.get(*i),
        })
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.0.iter().enumerate() {
            match segment {
                Segment::Key(k) if is_plain_name(k) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    f.write_str(k)?;
                }
                Segment::Key(k) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    write!(f, "\"{}\"", k.replace('"', "\"\""))?;
                }
                Segment::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

fn is_plain_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_alphabetic() || c == '_') && chars.all(|c| c.is_alphanumeric() || c == '_')
}

/// Whose fields a field expression reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Subject {
    /// The event being tested.
    Event,
    /// The first event a step has taken so far.
    First(String),
    /// The last event a step has taken so far.
    Last(String),
    /// The last event the partial match has taken, whatever its step.
    Prev,
}

/// Arithmetic operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ArithOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

/// Comparison operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// An expression of a DEFINE condition.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Expr {
    Lit(Value),
    Field(Subject, FieldPath),
    Count(String),
    Neg(Box<Expr>),
    Arith(ArithOp, Box<Expr>, Box<Expr>),
    Cmp(CmpOp, Box<Expr>, Box<Expr>),
    In { expr: Box<Expr>, list: Vec<Expr>, negated: bool },
    IsNull { expr: Box<Expr>, negated: bool },
    Not(Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
}

/// A value during evaluation, borrowing from the event or the expression.
#[derive(Clone, Copy, Debug)]
enum Val<'a> {
    Null,
    Bool(bool),
    Num(f64),
    Str(&'a str),
    /// An array or an object.
    Json(&'a Value),
}

impl<'a> Val<'a> {
    fn of(v: Option<&'a Value>) -> Val<'a> {
        match v {
            None | Some(Value::Null) => Val::Null,
            Some(Value::Bool(b)) => Val::Bool(*b),
            Some(Value::Number(n)) => n.as_f64().map_or(Val::Null, Val::Num),
            Some(Value::String(s)) => Val::Str(s),
            Some(v) => Val::Json(v),
        }
    }
}

/// Compares two values: only values of one type compare (numbers, strings,
/// booleans; arrays and objects for (in)equality only); anything else,
/// null included, is false, `!=` too.
fn compare(op: CmpOp, a: Val<'_>, b: Val<'_>) -> bool {
    let ordering = match (a, b) {
        (Val::Num(x), Val::Num(y)) => x.partial_cmp(&y),
        (Val::Str(x), Val::Str(y)) => Some(x.cmp(y)),
        (Val::Bool(x), Val::Bool(y)) => Some(x.cmp(&y)),
        (Val::Json(x), Val::Json(y)) if x.is_array() == y.is_array() => {
            return match op {
                CmpOp::Eq => x == y,
                CmpOp::Ne => x != y,
                _ => false,
            };
        }
        _ => None,
    };
    let Some(o) = ordering else { return false };
    match op {
        CmpOp::Eq => o == Ordering::Equal,
        CmpOp::Ne => o != Ordering::Equal,
        CmpOp::Lt => o == Ordering::Less,
        CmpOp::Le => o != Ordering::Greater,
        CmpOp::Gt => o == Ordering::Greater,
        CmpOp::Ge => o != Ordering::Less,
    }
}

impl Expr {
    /// Whether the expression is a condition (true or false) rather than a
    /// number or a string: what DEFINE, AND, OR and NOT need.
    pub(crate) fn is_condition(&self) -> bool {
        match self {
            Expr::Lit(v) => v.is_boolean(),
            Expr::Field(..) => true,
            Expr::Count(_) | Expr::Neg(_) | Expr::Arith(..) => false,
            Expr::Cmp(..) | Expr::In { .. } | Expr::IsNull { .. } | Expr::Not(_) | Expr::And(..) | Expr::Or(..) => true,
        }
    }

    /// The depth of the expression tree: 1 for a literal, a field or a count.
    pub(crate) fn depth(&self) -> usize {
        match self {
            Expr::Lit(_) | Expr::Field(..) | Expr::Count(_) => 1,
            Expr::Neg(e) | Expr::Not(e) | Expr::IsNull { expr: e, .. } => 1 + e.depth(),
            Expr::Arith(_, a, b) | Expr::Cmp(_, a, b) | Expr::And(a, b) | Expr::Or(a, b) => {
                1 + a.depth().max(b.depth())
            }
            Expr::In { expr, list, .. } => 1 + list.iter().map(Expr::depth).fold(expr.depth(), usize::max),
        }
    }

    /// What the expression is, for error messages.
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            Expr::Lit(Value::Number(_)) => "a number",
            Expr::Lit(Value::String(_)) => "a string",
            Expr::Lit(Value::Null) => "null",
            Expr::Count(_) => "a count",
            Expr::Neg(_) | Expr::Arith(..) => "arithmetic",
            _ => "a condition",
        }
    }

    /// Whether `event` satisfies the condition, given the events the
    /// partial match has taken.
    pub(crate) fn test<'a, H: History<'a>>(&'a self, event: &'a Value, taken: &H) -> bool {
        matches!(self.eval(event, taken), Val::Bool(true))
    }

    fn eval<'a, H: History<'a>>(&'a self, event: &'a Value, h: &H) -> Val<'a> {
        match self {
            Expr::Lit(v) => Val::of(Some(v)),
            Expr::Field(subject, path) => {
                let base = match subject {
                    Subject::Event => Some(event),
                    Subject::First(s) => h.first(s),
                    Subject::Last(s) => h.last(s),
                    Subject::Prev => h.prev(),
                };
                Val::of(base.and_then(|b| path.get(b)))
            }
            Expr::Count(s) => Val::Num(h.count(s) as f64),
            Expr::Neg(e) => match e.eval(event, h) {
                Val::Num(x) => Val::Num(-x),
                _ => Val::Null,
            },
            Expr::Arith(op, a, b) => {
                let (Val::Num(x), Val::Num(y)) = (a.eval(event, h), b.eval(event, h)) else {
                    return Val::Null;
                };
                let r = match op {
                    ArithOp::Add => x + y,
                    ArithOp::Sub => x - y,
                    ArithOp::Mul => x * y,
                    ArithOp::Div => x / y,
                    ArithOp::Rem => x % y,
                };
                if r.is_finite() {
                    Val::Num(r)
                } else {
                    Val::Null
                }
            }
            Expr::Cmp(op, a, b) => Val::Bool(compare(*op, a.eval(event, h), b.eval(event, h))),
            Expr::In { expr, list, negated } => {
                let v = expr.eval(event, h);
                let found = list.iter().any(|e| compare(CmpOp::Eq, v, e.eval(event, h)));
                Val::Bool(found != *negated)
            }
            Expr::IsNull { expr, negated } => Val::Bool(matches!(expr.eval(event, h), Val::Null) != *negated),
            Expr::Not(e) => Val::Bool(!e.test(event, h)),
            Expr::And(a, b) => Val::Bool(a.test(event, h) && b.test(event, h)),
            Expr::Or(a, b) => Val::Bool(a.test(event, h) || b.test(event, h)),
        }
    }
}

/// The events a partial match has taken, as conditions see them.
pub(crate) trait History<'a> {
    /// The first event of `step`.
    fn first(&self, step: &str) -> Option<&'a Value>;
    /// The last event of `step`.
    fn last(&self, step: &str) -> Option<&'a Value>;
    /// The last event taken.
    fn prev(&self) -> Option<&'a Value>;
    /// How many events `step` has taken.
    fn count(&self, step: &str) -> usize;
}

/// The history of a running match: the operator's [`Matched`], its events
/// seen as JSON through `view`.
pub(crate) struct MatchedHistory<'m, 'a, E, V> {
    pub(crate) matched: &'m Matched<'a, E>,
    pub(crate) view: &'m V,
}

impl<'a, E, V: Fn(&E) -> &Value> History<'a> for MatchedHistory<'_, 'a, E, V> {
    fn first(&self, step: &str) -> Option<&'a Value> {
        self.matched.first(step).map(self.view)
    }
    fn last(&self, step: &str) -> Option<&'a Value> {
        self.matched.last(step).map(self.view)
    }
    fn prev(&self) -> Option<&'a Value> {
        self.matched.events().last().map(self.view)
    }
    fn count(&self, step: &str) -> usize {
        self.matched.get(step).count()
    }
}

/// A history written out: (step, event) pairs in the order they were taken.
impl<'a> History<'a> for &'a [(&'a str, Value)] {
    fn first(&self, step: &str) -> Option<&'a Value> {
        self.iter().find(|(s, _)| *s == step).map(|(_, v)| v)
    }
    fn last(&self, step: &str) -> Option<&'a Value> {
        self.iter().rev().find(|(s, _)| *s == step).map(|(_, v)| v)
    }
    fn prev(&self) -> Option<&'a Value> {
        <[_]>::last(self).map(|(_, v)| v)
    }
    fn count(&self, step: &str) -> usize {
        self.iter().filter(|(s, _)| *s == step).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn comparisons_of_different_types_are_false() {
        let n = json!(1);
        let s = json!("1");
        assert!(!compare(CmpOp::Eq, Val::of(Some(&n)), Val::of(Some(&s))));
        assert!(!compare(CmpOp::Ne, Val::of(Some(&n)), Val::of(Some(&s))));
        assert!(!compare(CmpOp::Ne, Val::Null, Val::Null));
        assert!(compare(CmpOp::Eq, Val::of(Some(&json!(1.0))), Val::of(Some(&n))));
        assert!(compare(CmpOp::Lt, Val::Str("a"), Val::Str("b")));
        assert!(compare(CmpOp::Eq, Val::of(Some(&json!([1, 2]))), Val::of(Some(&json!([1, 2])))));
        assert!(!compare(CmpOp::Lt, Val::of(Some(&json!([1]))), Val::of(Some(&json!([2])))));
    }
}

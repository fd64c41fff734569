//! How a scenario ends: it passes, fails with what the runtime did, or cannot run against this
//! runtime; and the small vocabulary the scenarios are written in (`ensure!`, `ensure_eq!`,
//! [`OrFail`]), so that a runtime's wrong answer is reported, never panicked on.

use std::fmt;

/// Why a scenario ended before its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The runtime did something the scenario does not accept: what, in words.
    Fail(String),
    /// The scenario cannot run against this runtime (e.g. it has no pod network): why.
    Skip(String),
}

/// A scenario's step: its value, or why the scenario stops.
pub type Step<T = ()> = std::result::Result<T, Stop>;

/// Fails the scenario with the formatted message unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::outcome::Stop::Fail(format!($($fmt)+)));
        }
    };
}

/// Fails the scenario unless `left == right`, saying what was got and what was wanted.
macro_rules! ensure_eq {
    ($left:expr, $right:expr, $($fmt:tt)+) => {{
        let (got, want) = (&$left, &$right);
        if got != want {
            return Err($crate::outcome::Stop::Fail(format!(
                "{}: got {:?}, want {:?}",
                format_args!($($fmt)+),
                got,
                want
            )));
        }
    }};
}

/// Fails the scenario with the formatted message.
macro_rules! fail {
    ($($fmt:tt)+) => {
        return Err($crate::outcome::Stop::Fail(format!($($fmt)+)))
    };
}

pub(crate) use {ensure, ensure_eq, fail};

/// Turns a runtime error or a missing field into the scenario's failure, naming the call.
pub trait OrFail<T> {
    fn or_fail(self, what: impl fmt::Display) -> Step<T>;
}

impl<T> OrFail<T> for runtime::Result<T> {
    fn or_fail(self, what: impl fmt::Display) -> Step<T> {
        self.map_err(|e| Stop::Fail(format!("{what}: {e}")))
    }
}

impl<T> OrFail<T> for Option<T> {
    fn or_fail(self, what: impl fmt::Display) -> Step<T> {
        self.ok_or_else(|| Stop::Fail(format!("{what}: missing from the answer")))
    }
}

/// A scenario's result on one runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Fail(String),
    Skip(String),
}

impl Outcome {
    /// "pass", "fail" or "skip", as the JSON report spells them.
    pub fn status(&self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail(_) => "fail",
            Outcome::Skip(_) => "skip",
        }
    }

    /// The failure's or the skip's reason; empty for a pass.
    pub fn message(&self) -> &str {
        match self {
            Outcome::Pass => "",
            Outcome::Fail(m) | Outcome::Skip(m) => m,
        }
    }
}

impl From<Step> for Outcome {
    fn from(step: Step) -> Self {
        match step {
            Ok(()) => Outcome::Pass,
            Err(Stop::Fail(m)) => Outcome::Fail(m),
            Err(Stop::Skip(m)) => Outcome::Skip(m),
        }
    }
}

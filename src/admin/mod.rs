//! What sluice shows an operator. Today: its log lines (`log`). The admin API, metrics,
//! dashboard and access log join here.

pub mod log;

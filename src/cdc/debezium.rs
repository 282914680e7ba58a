//! The Debezium JSON change-event format.

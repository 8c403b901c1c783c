//! Trace tests.

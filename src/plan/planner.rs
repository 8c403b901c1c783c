//! Planner (being written).

//! What every request carries before any API family sees it: its id, the
//! API key check, and admission (the cap on requests in flight, draining).

pub mod admission;
pub mod auth;
pub mod id;

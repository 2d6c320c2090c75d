//! The AceMQ connection. TODO
/// TODO
#[derive(Debug)]
pub struct Connection;

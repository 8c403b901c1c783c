//! Metadata backend (being written).
use super::Backend;
use crate::{error::Result, plan::Plan};
/// Metadata backend.
#[derive(Debug)]
pub struct MetaBackend;
impl Backend for MetaBackend {
    fn capacity_bytes(&self) -> u64 { 0 }
    fn write(&mut self, _offset: u64, _bytes: &[u8]) -> Result<()> { Ok(()) }
    fn read(&mut self, _offset: u64, _out: &mut [u8]) -> Result<()> { Ok(()) }
    fn execute(&mut self, _plan: &Plan) -> Result<()> { Ok(()) }
}

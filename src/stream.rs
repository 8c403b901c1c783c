//! Streams an arena orders its work with (the contract is on [`StreamId`]).

/// Streams one arena can register, its own included: plenty for copy,
/// compute and communication streams, and a bound on the per-stream
/// tables the arena keeps ([`crate::Error::LimitReached`] past it).
pub(crate) const MAX_STREAMS: u32 = 1 << 16;

/// A stream registered with one arena; [`StreamId::ARENA`] is the arena's
/// own, in every arena. An id carries the id of the arena that registered
/// it, so another arena refuses it ([`crate::Error::UnknownStream`]) as it
/// refuses another arena's handles.
///
/// # Streams an arena orders its work with
///
/// Every transfer, compaction and device-side operation of an arena runs on
/// its own stream, [`StreamId::ARENA`]. Other streams (a copy stream, a
/// compute stream, NCCL's) are registered with the arena and named by a
/// [`StreamId`]. The contract, kept with events and stream waits only:
///
/// - **Uses are recorded.** A block used on a registered stream is marked
///   with that stream, explicitly (`record_stream`, as PyTorch's
///   `Tensor.record_stream`) or implicitly when kernel arguments or views
///   are taken for that stream.
/// - **Nothing moves or is reused under a use.** Before the arena frees a
///   block, moves it, spills it, or writes or reads it on its own stream, the
///   arena stream waits for everything enqueued so far on each stream the
///   block was used on. Freed bytes are reused only in arena-stream order.
/// - **Later work sees the moves.** Taking kernel arguments or views for a
///   registered stream first makes that stream wait for the arena stream's
///   work so far (moves, writes, frees), when there is any it has not waited
///   for yet.
/// - **Later work sees other streams' writes.** Kernel arguments remember,
///   per block, the stream that last wrote it and the streams that read it
///   since. An input taken for stream S makes S wait for the last writer; an
///   output makes S wait for the last writer and those readers. So an
///   all-reduce on the communication stream, then the optimizer's kernel on
///   the compute stream, run in that order without the caller joining the
///   streams. Raw pointers and explicit `record_stream` calls are not
///   tracked this way: order those streams yourself.
///
/// On the host backend every operation is synchronous, so the contract holds
/// trivially; the arena still validates stream ids and keeps the records, so
/// the same programs run on both backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub(crate) u32, pub(crate) u64);

impl StreamId {
    /// The arena's own stream: transfers, compactions and device-side
    /// operations run on it.
    pub const ARENA: StreamId = StreamId(0, 0);

    /// Index of the stream in its arena's registry (0 for the arena stream).
    pub fn index(self) -> u32 {
        self.0
    }

    /// Id of the arena that registered it (0 for [`StreamId::ARENA`]).
    pub fn arena_id(self) -> u64 {
        self.1
    }

    /// The id as arena `arena` hands it out (the arena stream stays
    /// [`StreamId::ARENA`]).
    pub(crate) fn of_arena(self, arena: u64) -> Self {
        if self.0 == 0 {
            StreamId::ARENA
        } else {
            StreamId(self.0, arena)
        }
    }
}

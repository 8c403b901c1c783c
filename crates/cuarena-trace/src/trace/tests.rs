use super::*;

#[test]
fn action_round_trips() {
    for a in Action::ALL {
        assert_eq!(Action::parse(a.as_str()), Some(a));
    }
    assert_eq!(Action::parse("free"), Some(Action::FreeCompleted));
    assert_eq!(Action::parse("snapshot"), None);
    assert_eq!(Action::parse("weird"), None);
}

#[test]
fn detects_formats_and_rejects_garbage() {
    let csv = b"action,addr,size,stream,time_us\nalloc,1,2,0,3\nsnapshot,0,0,0,4\nodd,1,1,1,1\n";
    let t = Trace::from_bytes(csv, "x").unwrap();
    assert_eq!(t.format, TraceFormat::Csv);
    assert_eq!(t.events.len(), 1);
    assert_eq!(t.counts.skipped(), 2);
    assert!(
        t.counts.summary().contains("1 `odd`"),
        "{}",
        t.counts.summary()
    );
    assert!(matches!(
        Trace::from_bytes(b"hello", "x"),
        Err(ToolError::Trace { record: 0, .. })
    ));
    assert!(matches!(
        Trace::from_bytes(b"", "x"),
        Err(ToolError::Trace { record: 0, .. })
    ));
    // Truncated gzip.
    assert!(matches!(
        Trace::from_bytes(&[0x1f, 0x8b, 8, 0], "x"),
        Err(ToolError::Trace { record: 0, .. })
    ));
}

#[test]
fn reserved_series_follows_segments() {
    let csv = b"action,addr,size,stream,time_us\n\
                segment_alloc,0,100,0,0\nalloc,0,10,0,1\nsegment_map,100,50,0,2\n\
                segment_free,0,100,0,3\n";
    let t = Trace::from_bytes(csv, "x").unwrap();
    assert_eq!(t.reserved_series(0), vec![(0, 100), (2, 150), (3, 50)]);
    let r = t.reserved(0);
    assert_eq!((r.initial, r.peak, r.peak_event), (None, 150, Some(2)));
    assert_eq!((r.at(0), r.at(1), r.at(2), r.at(9)), (100, 100, 150, 50));
    assert!(t.reserved_series(1).is_empty());
}

#[test]
fn reserved_starts_from_the_segments_at_the_dump() {
    let mut t = Trace::from_bytes(
        b"action,addr,size,stream,time_us\nalloc,5,10,0,0\nsegment_alloc,900,100,0,1\n",
        "x",
    )
    .unwrap();
    t.segments = Some(vec![Segment {
        device: 0,
        address: 0,
        total_size: 300,
        stream: 0,
        expandable: false,
        is_small: None,
        blocks: vec![],
    }]);
    let r = t.reserved(0);
    assert_eq!((r.initial, r.at_dump, r.peak), (Some(200), Some(300), 300));
    assert_eq!(r.series, vec![(0, 200), (1, 300)]);
}

#[test]
fn oversized_blocks_are_refused() {
    let csv = format!(
        "action,addr,size,stream,time_us\nalloc,1,{},0,0\n",
        u64::MAX - 3
    );
    match Trace::from_bytes(csv.as_bytes(), "x") {
        Err(ToolError::Trace {
            record, message, ..
        }) => {
            assert_eq!(record, 2);
            assert!(message.contains("18446744073709551612"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

//! The device handle ABI: what `Handle::to_bits` hands kernels and what
//! the public header `cuarena.cuh` decodes, and the table argument on both
//! sides, pinned together (host only; no GPU).

use std::mem::{align_of, offset_of, size_of};

use cuarena::backend::cuda::CUARENA_CUH as HEADER;
use cuarena::graph::{DeviceHandle, HandleArgs};
use cuarena::{Arena, ArenaConfig};

/// The definition of `name` in the header, whitespace squeezed.
fn define(name: &str) -> String {
    let line = HEADER
        .lines()
        .find(|l| l.starts_with(&format!("#define {name}")))
        .unwrap_or_else(|| panic!("cuarena.cuh defines {name}"));
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn the_header_decodes_the_abi() {
    // The header's decoding is `version << 32 | slot`, free version 0.
    assert_eq!(
        define("CUARENA_HANDLE_SLOT(h)"),
        "#define CUARENA_HANDLE_SLOT(h) ((unsigned int)((unsigned long long)(h) & 0xFFFFFFFFull))"
    );
    assert_eq!(
        define("CUARENA_HANDLE_VERSION(h)"),
        "#define CUARENA_HANDLE_VERSION(h) ((unsigned int)((unsigned long long)(h) >> 32))"
    );
    assert_eq!(
        define("CUARENA_FREE_VERSION"),
        "#define CUARENA_FREE_VERSION 0u"
    );
    // Both resolves decode through them, not by hand.
    assert!(HEADER.contains("table[CUARENA_HANDLE_SLOT(handle)].offset"));
    assert!(HEADER.contains("e.version != CUARENA_HANDLE_VERSION(handle)"));
    assert!(HEADER.contains("`version << 32 | slot`"));

    // What the crate hands out matches the header's comments.
    let mut a = Arena::metadata(ArenaConfig::new(1 << 20)).expect("arena");
    let h0 = a.alloc(100).expect("alloc");
    let h1 = a.alloc(100).expect("alloc");
    assert_eq!(h0.to_bits(), 1 << 32);
    assert_eq!(h1.to_bits(), (1 << 32) | 1);
    assert_eq!(DeviceHandle::from(h1).0, (1 << 32) | 1);
    a.free(h0).expect("free");
    let h2 = a.alloc(100).expect("alloc");
    assert_eq!(
        h2.to_bits(),
        3 << 32,
        "slot 0 reused with the next odd version"
    );
    // The table's entries (a freed slot reads version 0, live versions are
    // odd) are checked by the crate's unit tests (`src/arena/table_tests.rs`).
}

/// `CuarenaTable`, the table argument, is `HandleArgs` field for field:
/// two 8-byte words (base, table) then two 4-byte ones (slots, pad).
#[test]
fn the_table_argument_matches_handle_args() {
    let body = HEADER
        .split("struct CuarenaTable {")
        .nth(1)
        .and_then(|rest| rest.split("};").next())
        .expect("cuarena.cuh defines struct CuarenaTable");
    let decls: Vec<String> = body
        .lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(
        decls,
        [
            "unsigned long long base;",
            "const CuarenaEntry* table;",
            "unsigned int slots;",
            "unsigned int pad;",
        ]
    );
    let offsets = [
        offset_of!(HandleArgs, base),
        offset_of!(HandleArgs, table),
        offset_of!(HandleArgs, slots),
        offset_of!(HandleArgs, pad),
    ];
    assert_eq!(offsets, [0, 8, 16, 20]);
    assert_eq!((size_of::<HandleArgs>(), align_of::<HandleArgs>()), (24, 8));
}

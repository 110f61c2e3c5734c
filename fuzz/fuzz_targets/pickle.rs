//! The pickle machine on arbitrary bytes, through two builders: the value builder (`decode_with`, what every
//! format reads through) and the graph builder (an arena of nodes that the value is made from afterwards, the
//! reference): both must give the same value and end offset, or both fail with the same error. Whatever is
//! accepted must re-encode (protocols 2 to 5, shared objects and cycles included) into bytes that decode to
//! the same value again.
#![no_main]

use ckpt_pickle::{GraphBuilder, Limits, Options, decode_with};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let mut graph = GraphBuilder::default();
    let reference = ckpt_pickle::run(data, &Options::from(limits), &mut graph)
        .and_then(|(root, end)| Ok((graph.graph().to_value(root, limits.max_depth)?, end)));
    let value = match (decode_with(data, &limits), reference) {
        (Ok(fast), Ok(full)) => {
            // Debug renderings: NaN floats are equal there, unlike with `==`.
            assert_eq!(format!("{:?}", fast.0), format!("{:?}", full.0), "the value and graph builders differ");
            assert_eq!(fast.1, full.1, "the builders stop at different offsets");
            fast.0
        }
        (Err(a), Err(b)) => {
            assert_eq!(a.to_string(), b.to_string(), "the builders fail differently");
            return;
        }
        (Ok(fast), Err(e)) => panic!("the value builder gives {fast:?} where the graph builder fails: {e}"),
        (Err(e), Ok(full)) => panic!("the value builder fails ({e}) where the graph builder gives {full:?}"),
    };
    let value = value.desugar();
    // The limits count every reference to a shared object at that object's size when it is referenced, so
    // the same value counts more when the pickle writes a shared object whole before referring to it again
    // (as the encoder and CPython's pickler do) than when it grows the object after (as this input may):
    // the round trip is checked without the two counting limits (`fuzz_a_reference_counts_the_size_...`).
    let uncounted = Limits { max_nodes: usize::MAX, max_alloc_bytes: usize::MAX, ..limits };
    for protocol in 2..=5 {
        let Ok(bytes) = ckpt_pickle::encode(&value, protocol) else { continue };
        match decode_with(&bytes, &uncounted).map(|(v, _)| v) {
            Ok(back) => assert_eq!(
                format!("{:?}", back.desugar()),
                format!("{value:?}"),
                "protocol {protocol}: the re-encoded pickle decodes to another value"
            ),
            Err(e) => panic!("protocol {protocol}: the encoder wrote a pickle the decoder rejects: {e}"),
        }
    }
});

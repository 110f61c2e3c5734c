//! The pickle decoder on arbitrary bytes, both paths: `decode_with` (the single pass, falling back to the
//! full decoder when it declines) and `decode_graph` (the full decoder alone) must give the same value and
//! end offset, or both an error. Whatever is accepted must re-encode (protocols 2 to 5) into bytes that are
//! accepted again.
#![no_main]

use ckpt_pickle::{Limits, decode_graph, decode_with};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let (value, _) = match (decode_with(data, &limits), decode_graph(data, &limits)) {
        (Ok(fast), Ok(full)) => {
            // Debug renderings: NaN floats are equal there, unlike with `==`.
            assert_eq!(format!("{fast:?}"), format!("{full:?}"), "the single pass and the full decoder differ");
            fast
        }
        (Err(_), Err(_)) => return,
        (Ok(fast), Err(e)) => panic!("decode_with gives {fast:?} where the full decoder fails: {e}"),
        (Err(e), Ok(full)) => panic!("decode_with fails ({e}) where the full decoder gives {full:?}"),
    };
    let value = value.desugar();
    for protocol in 2..=5 {
        if let Ok(bytes) = ckpt_pickle::encode(&value, protocol)
            && let Err(e) = ckpt_pickle::decode(&bytes)
        {
            panic!("protocol {protocol}: the encoder wrote a pickle the decoder rejects: {e}");
        }
    }
});

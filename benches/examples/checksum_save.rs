//! The cost of `ckpt.checksums.json` on save (issue 12 point 4: under 5%): saves the same 512 MiB state in
//! distcp, hfai and RecIS with the manifest and without, interleaved (on, off, on, off, ...), and prints the
//! median wall time and the median CPU time (user + system of the process, every thread) of each, and
//! their ratios. The saves are the default ones (durable: fsync, staged commit).
//!
//! ```text
//! cargo run --release -p ckpt-benches --example checksum_save -- /tmp/dir [reps] [MiB]
//! ```

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::path::Path;
use std::time::{Duration, Instant};

use ckpt_tensor::{Tensor, Value};

/// CPU time (user + system) of this process so far.
fn cpu_time() -> Duration {
    // SAFETY: `getrusage` writes into the zeroed struct it is given.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(r.ru_utime) + tv(r.ru_stime)
}

fn floats(n: usize, seed: u32) -> Tensor {
    let v: Vec<f32> = (0..n).map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) as f32).collect();
    Tensor::from_slice(&v, &[n]).unwrap()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let root = Path::new(args.get(1).map_or("/tmp/checksum_save", String::as_str)).to_path_buf();
    let reps: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5);
    let mib: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(512);
    std::fs::create_dir_all(&root).unwrap();
    // 32 tensors (dense formats), 4 tables (RecIS), `mib` MiB of float32 in all.
    let per = (mib << 20) / 4 / 32;
    let dense =
        Value::dict((0..32).map(|i| (format!("layer{i}.weight"), Value::Tensor(floats(per, i)))).collect::<Vec<_>>());
    let rows = (mib << 20) / 4 / 4 / 128;
    let mut sparse = Vec::new();
    for t in 0..4 {
        let ids: Vec<i64> = (0..rows as i64).map(|i| i * 7 + t).collect();
        sparse.push((format!("t{t}@id"), Value::Tensor(Tensor::from_slice(&ids, &[rows]).unwrap())));
        let emb = floats(rows * 128, t as u32).reshape(&[rows, 128]).unwrap();
        sparse.push((format!("t{t}@embedding"), Value::Tensor(emb)));
    }
    let sparse = Value::dict(sparse);
    let hfai_model = Value::dict([("model", dense.clone())]);
    let (hfai_state, _) = ckpt_hfai::SaveState::from_state_dict(hfai_model.as_dict().unwrap());
    let save = |format: &str, checksums: bool, dir: &Path| {
        let durability = ckpt_io::Durability::default().with_checksums(checksums);
        match format {
            "distcp" => {
                let o = ckpt_distcp::WriteOptions::default().with_durability(durability).with_overwrite(true);
                ckpt_distcp::save(&dense, dir, &o).map(|_| ()).unwrap();
            }
            "hfai" => {
                let o = ckpt_hfai::WriteOptions::default().with_world_size(2).with_durability(durability);
                ckpt_hfai::save(&hfai_state, dir, &o).unwrap();
            }
            _ => {
                let o = ckpt_recis::WriteOptions::default().with_world_size(2).with_durability(durability);
                ckpt_recis::save(&sparse, dir, &o).map(|_| ()).unwrap();
            }
        }
    };
    println!("format  manifest  wall_median_s  cpu_median_s   ({reps} interleaved reps, {mib} MiB)");
    for format in ["distcp", "hfai", "recis"] {
        let (mut wall, mut cpu) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
        // One warm-up save of each, then on/off interleaved.
        for rep in 0..=reps {
            for (k, on) in [true, false].into_iter().enumerate() {
                let dir = root.join(format!("{format}_{k}"));
                let _ = std::fs::remove_dir_all(&dir);
                let (w0, c0) = (Instant::now(), cpu_time());
                save(format, on, &dir);
                let (w, c) = (w0.elapsed(), cpu_time() - c0);
                if rep > 0 {
                    wall[k].push(w);
                    cpu[k].push(c);
                }
                std::fs::remove_dir_all(&dir).unwrap();
            }
        }
        let (w_on, w_off) = (median(wall[0].clone()), median(wall[1].clone()));
        let (c_on, c_off) = (median(cpu[0].clone()), median(cpu[1].clone()));
        println!("{format:7} on        {:13.3}  {:12.3}", w_on.as_secs_f64(), c_on.as_secs_f64());
        println!("{format:7} off       {:13.3}  {:12.3}", w_off.as_secs_f64(), c_off.as_secs_f64());
        // The median of each repetition's own ratio: a load change between repetitions cancels out.
        let pair = |v: &[Vec<Duration>; 2]| {
            let mut r: Vec<f64> = v[0].iter().zip(&v[1]).map(|(a, b)| a.as_secs_f64() / b.as_secs_f64()).collect();
            r.sort_by(f64::total_cmp);
            r[r.len() / 2]
        };
        println!(
            "{format:7} on/off    ratio of medians: wall {:.3} cpu {:.3}; median of paired ratios: wall {:.3} cpu {:.3}; \
             checksum CPU {:.1} ms = {:.1}% of the wall time without",
            w_on.as_secs_f64() / w_off.as_secs_f64(),
            c_on.as_secs_f64() / c_off.as_secs_f64(),
            pair(&wall),
            pair(&cpu),
            (c_on.as_secs_f64() - c_off.as_secs_f64()) * 1e3,
            (c_on.as_secs_f64() - c_off.as_secs_f64()) / w_off.as_secs_f64() * 100.0
        );
    }
}

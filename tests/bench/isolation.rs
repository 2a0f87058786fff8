//! What isolation costs: `run_command "true"` in an isolated sandbox (namespaces, landlock) and
//! in one without isolation against `sh -c true`, `create_sandbox` + `kill_sandbox` with
//! namespaces and without, `create_sandbox` alone in the Landlock tier, and `create_sandbox` + a
//! first `run_command` against a bubblewrap one-shot sandbox.

use crate::bench::Bench;
use crate::control::Ctl;
use crate::probes::interleave;
use crate::process::{sh, spawn_time};
use crate::session::{self, Tools};
use crate::stats::Stats;
use crate::table::Row;
use crate::units::{dur, times};
use anyhow::{anyhow, Result};
use sandbox_mcp::client::StdioClient;
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The idle time before each paced `run_command` (not timed): a model reads one answer and
/// thinks before its next call, seconds usually; this much lets the shell an isolated sandbox
/// keeps waiting for its next command finish starting (about 1 ms of bash here). An idle
/// machine is slower to wake (about 0.1 ms more for `sh -c true` here), so a paced call is
/// compared with a floor paced alike; back-to-back calls get rows of their own.
const THINK: Duration = Duration::from_millis(10);

/// A session whose new sandboxes are isolated as `mode` says, with one sandbox made.
fn session_with(b: &Bench, mode: &str) -> Result<(StdioClient, String)> {
    let mut cmd = b.ours(&["stdio"]);
    cmd.env("SANDBOX_MCP_ISOLATION", mode);
    let mut rpc = session::spawn(cmd, &b.log(&format!("isolation-{mode}")))?;
    session::initialize(&mut rpc)?;
    let created = rpc.tool("create_sandbox", &json!({"timeout": 3600}))?;
    if created["isolation"] != json!(mode) {
        return Err(anyhow!("--isolation {mode} created {created}"));
    }
    let id = created["sandbox_id"].as_str().map(str::to_string).ok_or_else(|| anyhow!("create_sandbox returned {created}"))?;
    Ok((rpc, id))
}

/// A row of `lat` against the floor `floor`, named `what` in the comparison column.
fn against_floor(measurement: &str, lat: &Stats, what: &str, floor: &Stats) -> Row {
    Row::new("isolation", measurement)
        .lat(lat)
        .vs(format!("{what} {}", dur(floor.median)))
        .ratio(format!("{} floor", times(lat.median / floor.median)))
}

/// One `create_sandbox` + `kill_sandbox` pair; returns the seconds taken.
fn create_and_kill(rpc: &mut StdioClient) -> Result<f64> {
    let t = Instant::now();
    let created = rpc.tool("create_sandbox", &json!({"timeout": 60}))?;
    let id = created["sandbox_id"].clone();
    let killed: Value = rpc.tool("kill_sandbox", &json!({"sandbox_id": id}))?;
    let e = t.elapsed().as_secs_f64();
    if killed["killed"] != json!(true) {
        return Err(anyhow!("kill_sandbox {id} returned {killed}"));
    }
    Ok(e)
}

/// One `create_sandbox` + first `run_command "true"` (the kill that follows is not timed).
fn create_and_run(rpc: &mut StdioClient) -> Result<f64> {
    let t = Instant::now();
    let created = rpc.tool("create_sandbox", &json!({"timeout": 60}))?;
    let id = created["sandbox_id"].clone();
    let ran = rpc.tool("run_command", &json!({"sandbox_id": id, "command": "true"}))?;
    let e = t.elapsed().as_secs_f64();
    rpc.tool("kill_sandbox", &json!({"sandbox_id": id}))?;
    if ran["exit_code"] != json!(0) {
        return Err(anyhow!("run_command true in {id} returned {ran}"));
    }
    Ok(e)
}

/// A bubblewrap one-shot sandbox running `sh -c true`: every namespace, the host's `/usr`
/// read-only (the merged-/usr directories as links, or read-only too), its own `/proc`, `/dev`
/// and `/tmp`.
fn bwrap_true(bwrap: &Path) -> Command {
    let mut c = Command::new(bwrap);
    c.args(["--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr"]);
    for dir in ["/bin", "/sbin", "/lib", "/lib64"] {
        match std::fs::read_link(dir) {
            Ok(target) => c.arg("--symlink").arg(target).arg(dir),
            Err(_) if Path::new(dir).is_dir() => c.args(["--ro-bind", dir, dir]),
            Err(_) => &mut c,
        };
    }
    c.args(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "sh", "-c", "true"]);
    c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    c
}

/// One `create_sandbox`, timed, then its `kill_sandbox`, not timed; returns the seconds taken.
fn create_only(rpc: &mut StdioClient) -> Result<f64> {
    let t = Instant::now();
    let created = rpc.tool("create_sandbox", &json!({"timeout": 60}))?;
    let e = t.elapsed().as_secs_f64();
    rpc.tool("kill_sandbox", &json!({"sandbox_id": created["sandbox_id"].clone()}))?;
    Ok(e)
}

/// The Landlock tier's rows; measured only where the kernel has Landlock.
fn landlock_rows(b: &mut Bench) -> Result<()> {
    if let Err(why) = sandbox_mcp::provider::local::isolation::landlock::available() {
        b.row(Row::new("isolation", "Landlock tier").not_measured(why));
        return Ok(());
    }
    let (ll, ll_sb) = session_with(b, "landlock")?;
    let (warm, rounds, block) = (b.n(30), b.n(10), b.n(30));
    let args = json!({"sandbox_id": ll_sb, "command": "true"});
    let ok = |r: &Value| r["exit_code"] == json!(0);
    let ll = std::cell::RefCell::new(ll);
    let xs = interleave(
        warm,
        rounds,
        block,
        &mut [
            Box::new(|| {
                std::thread::sleep(THINK);
                ll.borrow_mut().timed("run_command", &args, ok)
            }),
            Box::new(|| ll.borrow_mut().timed("run_command", &args, ok)),
            Box::new(|| {
                std::thread::sleep(THINK);
                spawn_time(&mut sh("true", &[]))
            }),
            Box::new(|| spawn_time(&mut sh("true", &[]))),
            Box::new(|| {
                std::thread::sleep(THINK);
                spawn_time(Command::new("bash").args(["-c", "true"]).stdin(Stdio::null()))
            }),
        ],
    )?;
    let mut ll = ll.into_inner();
    let confined = b.keep("isolation.run_command_true.landlock", &xs[0]);
    let back_to_back = b.keep("isolation.run_command_true.landlock_back_to_back", &xs[1]);
    let floor = b.keep("isolation.floor.sh_c_true_landlock_paced", &xs[2]);
    let floor_back_to_back = b.keep("isolation.floor.sh_c_true_landlock", &xs[3]);
    // What `run_command` would cost if bash started for it: the start the waiting shell saves.
    let bash = b.keep("isolation.floor.bash_c_true_landlock_paced", &xs[4]);
    let r = confined.median / floor.median;
    b.row(
        Row::new(
            "isolation",
            "`run_command \"true\"`, Landlock tier, one call at a time (each call and each floor run after 10 ms idle, as a model calls: the command runs in the shell its spawner keeps waiting)",
        )
        .lat(&confined)
        .vs(format!("`sh -c true` {}; `bash -c true` {} (also after 10 ms idle)", dur(floor.median), dur(bash.median)))
        .ratio(format!("{} floor; {} bash", times(r), times(confined.median / bash.median)))
        .target("≤ 1.5× floor", r <= 1.5),
    );
    b.row(against_floor(
        "`run_command \"true\"`, Landlock tier, back-to-back (the next waiting shell is still starting)",
        &back_to_back,
        "`sh -c true` back-to-back",
        &floor_back_to_back,
    ));
    let (warm, rounds, block) = (b.n(3), b.n(5), b.n(6));
    let xs = interleave(warm, rounds, block, &mut [Box::new(|| create_only(&mut ll))])?;
    let created = b.keep("isolation.create.landlock", &xs[0]);
    b.row(
        Row::new("isolation", "`create_sandbox`, Landlock tier (directories, uid claim, keeper)")
            .lat(&created)
            .target("≤ 5 ms", created.median <= 0.005),
    );
    ll.tool("kill_sandbox", &json!({"sandbox_id": ll_sb}))?;
    ll.end()?;
    Ok(())
}

/// The rows; the namespace rows measured only where the host allows namespaces.
pub fn isolation_rows(b: &mut Bench, _ctl: &mut Ctl) -> Result<()> {
    landlock_rows(b)?;
    if let Err(why) = sandbox_mcp::provider::local::isolation::probe() {
        b.row(Row::new("isolation", "namespace isolation").not_measured(format!("this host refuses namespaces: {why}")));
        return Ok(());
    }
    let (mut iso, iso_sb) = session_with(b, "namespaces")?;
    let (mut none, none_sb) = session_with(b, "none")?;
    let (warm, rounds, block) = (b.n(30), b.n(10), b.n(30));
    let true_in = |sb: &str| json!({"sandbox_id": sb, "command": "true"});
    let (iso_args, none_args) = (true_in(&iso_sb), true_in(&none_sb));
    let ok = |r: &Value| r["exit_code"] == json!(0);
    let iso_cell = std::cell::RefCell::new(&mut iso);
    let xs = interleave(
        warm,
        rounds,
        block,
        &mut [
            Box::new(|| iso_cell.borrow_mut().timed("run_command", &iso_args, ok)),
            Box::new(|| {
                std::thread::sleep(THINK);
                iso_cell.borrow_mut().timed("run_command", &iso_args, ok)
            }),
            Box::new(|| none.timed("run_command", &none_args, ok)),
            Box::new(|| spawn_time(&mut sh("true", &[]))),
            Box::new(|| {
                std::thread::sleep(THINK);
                spawn_time(&mut sh("true", &[]))
            }),
        ],
    )?;
    let isolated = b.keep("isolation.run_command_true.namespaces", &xs[0]);
    let paced = b.keep("isolation.run_command_true.namespaces_paced", &xs[1]);
    let plain = b.keep("isolation.run_command_true.none", &xs[2]);
    let floor = b.keep("isolation.floor.sh_c_true", &xs[3]);
    let floor_paced = b.keep("isolation.floor.sh_c_true_paced", &xs[4]);
    let r = isolated.median / floor.median;
    b.row(
        against_floor(
            "`run_command \"true\"`, isolated sandbox (namespaces, started by its init), back-to-back",
            &isolated,
            "`sh -c true`",
            &floor,
        )
        .target("≤ 3× floor", r <= 3.0),
    );
    b.row(against_floor(
        "`run_command \"true\"`, isolated sandbox (namespaces), one call at a time (after 10 ms idle)",
        &paced,
        "`sh -c true` after 10 ms idle",
        &floor_paced,
    ));
    b.row(against_floor("`run_command \"true\"`, sandbox without isolation", &plain, "`sh -c true`", &floor));
    let (warm, rounds, block) = (b.n(3), b.n(5), b.n(6));
    let xs = interleave(warm, rounds, block, &mut [Box::new(|| create_and_kill(&mut iso)), Box::new(|| create_and_kill(&mut none))])?;
    let iso_ck = b.keep("isolation.create_kill.namespaces", &xs[0]);
    let none_ck = b.keep("isolation.create_kill.none", &xs[1]);
    b.row(
        Row::new("isolation", "`create_sandbox` + `kill_sandbox`, isolated (init, root filesystem, namespaces)")
            .lat(&iso_ck)
            .vs(format!("without isolation {}", dur(none_ck.median)))
            .ratio(format!("{} without", times(iso_ck.median / none_ck.median)))
            .target("< 50 ms together", iso_ck.median < 0.050),
    );
    match sandbox_mcp::provider::process::which("bwrap", &std::env::var("PATH").unwrap_or_default()) {
        None => b.row(
            Row::new("isolation", "`create_sandbox` + first `run_command`, against bubblewrap").not_measured("bwrap is not installed"),
        ),
        Some(bwrap) => {
            let (warm, rounds, block) = (b.n(3), b.n(5), b.n(6));
            let xs = interleave(
                warm,
                rounds,
                block,
                &mut [Box::new(|| create_and_run(&mut iso)), Box::new(|| spawn_time(&mut bwrap_true(&bwrap)))],
            )?;
            let ours = b.keep("isolation.create_run.namespaces", &xs[0]);
            let peer = b.keep("isolation.bwrap_true", &xs[1]);
            let r = ours.median / peer.median;
            b.row(Row::floor("isolation", "`bwrap --unshare-all … sh -c true` (a one-shot sandbox)", &peer));
            b.row(
                Row::new("isolation", "isolated `create_sandbox` + first `run_command \"true\"`")
                    .lat(&ours)
                    .vs(format!("bubblewrap one-shot {}", dur(peer.median)))
                    .ratio(format!("{} bubblewrap", times(r)))
                    .target("≤ 2× bubblewrap", r <= 2.0),
            );
        }
    }
    for (mut rpc, sb) in [(iso, iso_sb), (none, none_sb)] {
        rpc.tool("kill_sandbox", &json!({"sandbox_id": sb}))?;
        rpc.end()?;
    }
    Ok(())
}

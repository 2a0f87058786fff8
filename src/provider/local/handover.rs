//! The hand-over: a run_command still running at its promotion time is adopted by the task
//! supervisor (its output so far staged, its pipes passed on), and the server records its exit
//! code when it reaps it.

use super::isolation::{rootfs, spawner, Isolation};
use super::launch::Launch;
use super::{LocalProvider, TASK_TAG_VAR};
use crate::limits;
use crate::provider::process;
use crate::provider::{unix_now, Adopter, Adoption, ExecEnd, ExecRequest, Promotion, Provider, ProviderError, Touch, TASKS_DIR};
use std::collections::BTreeMap;
use std::fs;
use std::os::fd::AsFd;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// How long the adopt snippet may take to answer.
pub(super) const ADOPT_BUDGET: Duration = Duration::from_secs(10);

impl Adopter for LocalProvider {
    fn exec_or_promote(
        &self,
        sandbox_id: &str,
        req: &ExecRequest,
        touch: Touch,
        promotion: &Promotion<'_>,
    ) -> Result<ExecEnd, ProviderError> {
        let mut req = req.clone();
        let Some(dir) = self.task_dir(sandbox_id, promotion.task_id) else {
            // Not a live sandbox: run the command the plain way, which says why.
            req.argv = self.shell(promotion.command);
            return self.run_exec(sandbox_id, &req, touch, None);
        };
        // Adoptable from its start: the task tag, and an EXIT trap that records its exit code once
        // its task directory exists.
        req.argv = self.shell(&adoptable(promotion.command, &dir));
        req.envs.insert(TASK_TAG_VAR.to_string(), promotion.task_id.to_string());
        self.run_exec(sandbox_id, &req, touch, Some(promotion))
    }

    fn task_id(&self, sandbox_id: &str, req: &ExecRequest, command: &str) -> String {
        // The waiting shell's tag goes only to a command that can run there: the check `launch`
        // makes of what `exec_or_promote` builds (a task directory's path is as long for every
        // id), made only where such a shell waits.
        let runs_there = || {
            req.envs.is_empty()
                && req.cwd.is_none()
                && self
                    .task_dir(sandbox_id, &"0".repeat(32))
                    .is_some_and(|dir| self.warm(&self.shell(&adoptable(command, &dir)), &BTreeMap::new()))
        };
        self.waiting_tag(sandbox_id, runs_there).unwrap_or_else(crate::ids::task_id)
    }
}

impl LocalProvider {
    /// The directory of task `task_id` as the sandbox's shell sees it; `None` when the sandbox's
    /// metadata cannot be read.
    fn task_dir(&self, sandbox_id: &str, task_id: &str) -> Option<String> {
        let meta = self.load(sandbox_id).ok()?;
        let home = match meta.isolation {
            Isolation::Namespaces => rootfs::HOME.to_string(),
            Isolation::Landlock | Isolation::None => self.home(sandbox_id).to_str()?.to_string(),
        };
        Some(format!("{home}/{TASKS_DIR}/{task_id}"))
    }

    /// Hands a running command over to the supervisor's adopt mode: stages the output captured so
    /// far (masked, capped), runs `start.sh adopt` with the pipes' read ends as its stdin and
    /// stderr, and reads its answer. Returns what to do once the server reaps the command: write
    /// its exit code into the task directory when its shell's `EXIT` trap did not.
    pub(super) fn adopt(
        &self,
        id: &str,
        req: &ExecRequest,
        p: &Promotion<'_>,
        h: &process::Handover<'_>,
    ) -> Result<process::OnEnd, String> {
        let (meta, init) = self.reach_with_init(id, Touch::Observe).map_err(|e| e.to_string())?;
        // Through the sandbox's own file view (the kernel keeps every lookup inside, with the
        // sandbox's uid under a root server): the sandbox can plant links in its home.
        let fs = match init {
            Some(init) => Self::sandbox_fs(id, &meta, init),
            None => self.home_fs(id, &meta, ".").map(|(fs, _)| fs),
        }
        .map_err(|e| e.to_string())?;
        let (stdout, out_cut, stderr, err_cut) = h.captured();
        let mut pre = [0usize; 2];
        let mut cut = [out_cut, err_cut];
        for (i, (bytes, suffix)) in [(stdout, "stdout.log"), (stderr, "stderr.log")].into_iter().enumerate() {
            if bytes.is_empty() {
                continue;
            }
            let mut masked = p.masker.mask_bytes(bytes);
            if masked.len() > limits::MAX_LOG_BYTES {
                masked.truncate(limits::MAX_LOG_BYTES);
                cut[i] = true;
            }
            pre[i] = masked.len();
            let rel = format!("{TASKS_DIR}/.adopt-{}.{suffix}", p.task_id);
            fs.write(&rel, &masked).map(drop).map_err(|e| format!("staging the output so far: {e}"))?;
        }
        let elapsed = h.elapsed();
        let left = p.timeout.saturating_sub(elapsed).max(Duration::from_millis(10));
        let left = format!("{}.{:02}", left.as_secs(), left.subsec_millis() / 10);
        let started_at = unix_now() - elapsed.as_secs() as i64;
        let adoption = Adoption {
            task_id: p.task_id,
            timeout: p.timeout.as_secs().max(1) as i64,
            left: &left,
            pgid: h.pgid(),
            pre: (pre[0], pre[1]),
            truncated: (cut[0], cut[1]),
            started_at,
            command: p.command,
        };
        let argv = (p.adopter)(&adoption);
        // The adopter gets the command's environment (its masker reads it), without the task tag.
        let mut envs = req.envs.clone();
        envs.remove(TASK_TAG_VAR);
        let dup = |pipe: Option<&fs::File>| -> Result<Stdio, String> {
            match pipe {
                Some(f) => f.try_clone().map(Stdio::from).map_err(|e| format!("duplicating a pipe: {e}")),
                None => fs::File::open("/dev/null").map(Stdio::from).map_err(|e| format!("opening /dev/null: {e}")),
            }
        };
        let [out_pipe, err_pipe] = h.pipes();
        let (answer_read, answer_write) =
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| format!("making the answer pipe: {e}"))?;
        let deadline = Instant::now() + ADOPT_BUDGET;
        let launch = self.launch(id, &argv, &envs, None, Touch::Observe, true).map_err(|e| e.to_string())?;
        let answer = match launch {
            Launch::Spawner { to, argv, env, .. } => {
                let null = fs::File::open("/dev/null").map_err(|e| format!("opening /dev/null: {e}"))?;
                let out_fd = out_pipe.map_or(null.as_fd(), |f| f.as_fd());
                let err_fd = err_pipe.map_or(null.as_fd(), |f| f.as_fd());
                let mut remote = spawner::Remote::spawn(&to, &argv, env, None, &answer_write, err_fd, Some(out_fd))
                    .map_err(|e| format!("starting the adopter: {e}"))?;
                drop(answer_write);
                let answer = process::read_until_end(fs::File::from(answer_read), deadline);
                let _ = remote.wait_within(deadline.saturating_duration_since(Instant::now()));
                answer
            }
            Launch::Host(mut cmd, _) => {
                cmd.stdin(dup(out_pipe)?).stdout(Stdio::from(answer_write)).stderr(dup(err_pipe)?);
                let child = cmd.spawn();
                // (The command holds our copies of its stdio until dropped.)
                drop(cmd);
                let mut child = child.map_err(|e| format!("starting the adopter: {e}"))?;
                let answer = process::read_until_end(fs::File::from(answer_read), deadline);
                let _ = child.wait();
                answer
            }
        }
        .map_err(|e| format!("reading the adopter's answer: {e}"))?;
        let answer = String::from_utf8_lossy(&answer);
        if !answer.lines().any(|l| l == "@adopted running") {
            let why = answer.lines().find_map(|l| l.strip_prefix("@error ")).unwrap_or("no answer");
            return Err(format!("the supervisor did not adopt it: {why}"));
        }
        let task_dir = format!("{TASKS_DIR}/{}", p.task_id);
        Ok(Box::new(move |code: Option<i32>| {
            let Some(code) = code else { return };
            let text = format!("{code}\n");
            let file = format!("{task_dir}/exit_code");
            if fs.is_dir(&task_dir) && fs.read(&file, 64).is_err() && fs.write(&file, text.as_bytes()).is_err() {
                log::debug!("could not record the exit code of task {task_dir}");
            }
        }))
    }
}

/// `command` preceded by an `EXIT` trap that writes its exit status into `dir/exit_code` once
/// `dir` exists (it does once the command became a task), with builtins only: a quick command pays
/// nothing for it. A command that sets its own `EXIT` trap replaces this one.
fn adoptable(command: &str, dir: &str) -> String {
    let dir = sh_quote(dir);
    let trap = format!("_rc=$?; [ -d {dir} ] && echo \"$_rc\" >{dir}/exit_code; exit \"$_rc\"");
    format!("trap {} EXIT; {command}", sh_quote(&trap))
}

/// `s` as one single-quoted shell word.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_trap_records_the_status_only_once_the_directory_exists() {
        // Under every shell a command may run with: sh, and bash where the host has it.
        for (i, shell) in ["/bin/sh", "/bin/bash"].into_iter().enumerate() {
            if !std::path::Path::new(shell).exists() {
                continue;
            }
            let tmp = std::env::temp_dir().join(format!("sandbox-mcp-trap-{}-{i}", std::process::id()));
            let dir = tmp.join("it's here");
            let run = |cmd: &str| {
                let script = adoptable(cmd, dir.to_str().unwrap());
                std::process::Command::new(shell).args(["-c", &script]).status().unwrap().code()
            };
            assert_eq!(run("exit 7"), Some(7), "{shell}");
            assert!(!dir.exists());
            std::fs::create_dir_all(&dir).unwrap();
            assert_eq!(run("false"), Some(1), "{shell}");
            assert_eq!(std::fs::read_to_string(dir.join("exit_code")).unwrap(), "1\n", "{shell}");
            assert_eq!(run("(exit 7)"), Some(7), "{shell}");
            assert_eq!(std::fs::read_to_string(dir.join("exit_code")).unwrap(), "7\n", "{shell}");
            // The last command of the line is not exec'd in place of the shell (bash does that
            // for a lone command): the trap still runs after it.
            assert_eq!(run("sh -c 'exit 5'"), Some(5), "{shell}");
            assert_eq!(std::fs::read_to_string(dir.join("exit_code")).unwrap(), "5\n", "{shell}");
            std::fs::remove_dir_all(&tmp).unwrap();
        }
    }
}

//! Launch: how a command starts in a local sandbox (its environment, working directory and
//! process group; on the host, through `nsenter`, or through the init's spawner) and runs to its
//! end or to its hand-over.

use super::isolation::enter;
use super::isolation::{cgroup, landlock, rootfs, spawner, warm_shell, Isolation};
use super::{LocalProvider, Meta, TAG_VAR, TASK_TAG_VAR, TMP_DIR};
use crate::provider::process::{self, Ran, Spawn};
use crate::provider::{ExecEnd, ExecOutput, ExecRequest, Promotion, ProviderError, Touch};
use std::collections::BTreeMap;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The entries of the host's `path` that are directories inside a sandbox isolated as `isolation`.
fn path_inside(path: &str, isolation: Isolation) -> String {
    let visible = |dir: &str| match isolation {
        Isolation::Namespaces | Isolation::Landlock => crate::provider::local::isolation::rootfs::SYSTEM_DIRS
            .iter()
            .any(|sys| dir == *sys || dir.strip_prefix(sys).is_some_and(|rest| rest.starts_with('/'))),
        Isolation::None => true,
    };
    let mut kept: Vec<&str> = Vec::new();
    for dir in path.split(':') {
        if dir.starts_with('/') && visible(dir) && Path::new(dir).is_dir() && !kept.contains(&dir) {
            kept.push(dir);
        }
    }
    kept.join(":")
}

impl LocalProvider {
    pub(super) fn env_for(&self, id: &str, meta: &Meta, extra: &BTreeMap<String, String>) -> Vec<(String, String)> {
        let mut env: BTreeMap<String, String> = self.inherited_env.iter().cloned().collect();
        // Only the directories that exist inside: an isolated sandbox sees the host's system
        // directories only, never the server user's own (`~/.cargo/bin`, ...).
        let path = env.get("PATH").map(|p| path_inside(p, meta.isolation)).filter(|p| !p.is_empty());
        env.insert("PATH".into(), path.unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()));
        let home = match meta.isolation {
            Isolation::Namespaces => rootfs::HOME.to_string(),
            Isolation::Landlock | Isolation::None => self.home(id).to_string_lossy().into_owned(),
        };
        env.insert("HOME".into(), home);
        if meta.proxy {
            // The sandbox's only way out; its own envs may still override them.
            env.extend(crate::egress::proxy_env());
        }
        if meta.isolation == Isolation::Landlock {
            env.insert("TMPDIR".into(), self.dir(id).join(TMP_DIR).to_string_lossy().into_owned());
        }
        env.extend(meta.envs.iter().map(|(k, v)| (k.clone(), v.clone())));
        env.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        env.insert(TAG_VAR.into(), id.into());
        env.into_iter().collect()
    }

    /// Builds the command that runs `argv` in live sandbox `id`, as `exec` runs it: the environment
    /// is cleared and rebuilt from the host allow-list (`PATH`, `LANG`, `TERM`, `TZ`), `HOME` (the
    /// sandbox home), the sandbox's envs, then `envs`, then the sandbox tag ([`TAG_VAR`]); the
    /// working directory is `cwd` (absolute, or relative to the sandbox home; the home when
    /// `None`), which must be an existing directory; the child will lead a process group of its
    /// own (in an isolated sandbox also a session of its own: callers add no `process_group`).
    /// Stdio is left to the caller, who also reaps the child. Renews the TTL when `touch` is
    /// [`Touch::Renew`]; an expired sandbox is killed and reported as not found.
    pub fn command(
        &self,
        id: &str,
        argv: &[String],
        envs: &BTreeMap<String, String>,
        cwd: Option<&Path>,
        touch: Touch,
    ) -> Result<Command, ProviderError> {
        match self.launch(id, argv, envs, cwd, touch, false)? {
            Launch::Host(cmd, _) => Ok(cmd),
            Launch::Spawner { .. } => Err(ProviderError::Unavailable("internal error: a host command was asked for".into())),
        }
    }

    /// How `argv` starts in live sandbox `id`, as [`LocalProvider::command`] describes; with
    /// `spawner`, an isolated sandbox whose init serves spawn requests starts it through them.
    pub(super) fn launch(
        &self,
        id: &str,
        argv: &[String],
        envs: &BTreeMap<String, String>,
        cwd: Option<&Path>,
        touch: Touch,
        spawner: bool,
    ) -> Result<Launch, ProviderError> {
        let (meta, init) = self.reach_with_init(id, touch)?;
        if let Some(bad) = envs.keys().find(|k| k.is_empty() || k.contains('=') || k.contains('\0')) {
            return Err(ProviderError::Rejected(format!("environment variable name {bad:?} is not valid")));
        }
        let (program, args) =
            argv.split_first().ok_or_else(|| ProviderError::Rejected("the command is empty; give at least the program to run".into()))?;
        let not_a_dir = |c: &Path| ProviderError::Rejected(format!("cwd {c:?} is not an existing directory in the sandbox"));
        // Only a command the server starts itself joins the cgroups (a spawner's are in them).
        let cgroups = || if meta.limits.cgroups() { cgroup::procs_files(id) } else { Vec::new() };
        // What a spawner keeps waiting for the next command after this one, where this one may
        // run in such a shell (its whole environment `env` suits one too).
        let warm = cwd.is_none() && self.warm(argv, envs);
        let next_env = |env: &[(String, String)]| (warm && warm_shell::fits(argv, env)).then(|| self.next_env(id, &meta));
        let (mut cmd, adoptable) = match init {
            Some(init) => {
                let cwd = match cwd {
                    Some(c) => {
                        let c = c.to_str().ok_or_else(|| not_a_dir(c))?;
                        if !Self::sandbox_fs(id, &meta, init)?.is_dir(c) {
                            return Err(not_a_dir(Path::new(c)));
                        }
                        Some(c)
                    }
                    None => None,
                };
                let to = spawner::Endpoint::in_dir(&self.dir(id), false);
                if spawner && to.socket.exists() {
                    // The init's children are in its namespaces and cgroups already.
                    let env = self.env_for(id, &meta, envs);
                    let next_env = next_env(&env);
                    return Ok(Launch::Spawner { to, argv: argv.to_vec(), env, cwd: cwd.map(str::to_string), next_env });
                }
                (enter::command(self.tools()?, &self.exe, init, !meta.host_network, argv, cwd, &cgroups()), false)
            }
            None => {
                let home = self.home(id);
                let dir = match cwd {
                    None => home,
                    Some(c) if home.join(c).is_dir() => home.join(c),
                    Some(c) => return Err(not_a_dir(c)),
                };
                if meta.isolation == Isolation::Landlock && meta.spawner {
                    // Its spawner, confined already, starts it in the sandbox's one domain; the
                    // server never starts one itself.
                    if !spawner {
                        return Err(ProviderError::Unavailable(format!(
                            "sandbox {id} is in the landlock tier, whose commands start from its spawner only; run it through exec"
                        )));
                    }
                    let env = self.env_for(id, &meta, envs);
                    let next_env = next_env(&env);
                    let cwd = dir.to_str().ok_or_else(|| not_a_dir(&dir))?.to_string();
                    return Ok(Launch::Spawner {
                        to: spawner::Endpoint::in_dir(&self.dir(id), true),
                        argv: argv.to_vec(),
                        env,
                        cwd: Some(cwd),
                        next_env,
                    });
                }
                if meta.isolation == Isolation::Landlock {
                    let mut cmd = Command::new(program);
                    cmd.args(args).current_dir(dir).process_group(0);
                    if let Some(uid) = meta.own_uid() {
                        cmd.uid(uid).gid(uid);
                    }
                    let (home, tmp) = (self.home(id), self.dir(id).join(TMP_DIR));
                    // No egress yet: no TCP port is allowed (the egress proxy's, later).
                    let plan = landlock::Plan {
                        home: &home,
                        tmp: &tmp,
                        shell: &self.shell,
                        // A sandbox made before the spawner: each command a domain of its own,
                        // where a signal scope would keep cancel_task from its tasks.
                        scope_signals: false,
                        connect_port: None,
                        cgroups: &cgroups(),
                        terminals: meta.own_uid().is_some(),
                    };
                    let confinement = landlock::prepare(&plan)
                        .map_err(|why| ProviderError::Unavailable(format!("could not confine the command in sandbox {id}: {why}")))?;
                    landlock::confine(&mut cmd, confinement);
                    (cmd, true)
                } else {
                    let mut cmd = enter::joined(&cgroups(), Path::new(program));
                    cmd.args(args).current_dir(dir).process_group(0);
                    (cmd, true)
                }
            }
        };
        cmd.env_clear().envs(self.env_for(id, &meta, envs));
        Ok(Launch::Host(cmd, adoptable))
    }

    /// Whether a command `argv` with per-call environment `envs` (and the default working
    /// directory) may run in a shell that waited for it, and leave one waiting with its program
    /// and environment: a script of the command shell, bash, whose per-call environment is at
    /// most a task tag (no value of one call is kept for the next). (The sandbox's own
    /// environment must suit a waiting shell too: `warm_shell::fits`.)
    pub(super) fn warm(&self, argv: &[String], envs: &BTreeMap<String, String>) -> bool {
        envs.keys().all(|name| name == TASK_TAG_VAR)
            && argv.first().is_some_and(|program| Path::new(program) == self.command_shell)
            && warm_shell::fits(argv, &[])
    }

    /// Asks the spawner of new sandbox `id` (bound, perhaps not serving yet: the request waits in
    /// its socket's backlog) to keep a shell waiting for its first command, as it does for every
    /// command after, where the sandbox's environment suits one. Best effort: a first command
    /// that finds no shell waiting starts cold.
    pub(super) fn prepare_first_shell(&self, id: &str, meta: &Meta) {
        let Some(shell) = self.command_shell.to_str() else { return };
        let argv = [shell.to_string(), "-c".to_string(), String::new()];
        let none = BTreeMap::new();
        if !self.warm(&argv, &none) || !warm_shell::fits(&argv, &self.env_for(id, meta, &none)) {
            return;
        }
        // Where `launch` starts a command with no `cwd`: the namespace tier's init knows its home.
        let home = self.home(id);
        let (keyed, cwd) = match meta.isolation {
            Isolation::Namespaces => (false, None),
            Isolation::Landlock => (true, home.to_str()),
            Isolation::None => return,
        };
        if keyed && cwd.is_none() {
            return;
        }
        let to = spawner::Endpoint::in_dir(&self.dir(id), keyed);
        if let Err(err) = spawner::prepare(&to, shell, cwd, self.next_env(id, meta)) {
            log::debug!("sandbox {id}: no shell waits for the first command: {err}");
        }
    }

    /// The environment of the shell to keep waiting for the next command into sandbox `id`:
    /// the sandbox's, with a new task tag, which the next command takes ([`Self::waiting_tag`]).
    fn next_env(&self, id: &str, meta: &Meta) -> Vec<(String, String)> {
        let tag = crate::ids::task_id();
        let env = self.env_for(id, meta, &BTreeMap::from([(TASK_TAG_VAR.to_string(), tag.clone())]));
        self.next_tags.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(id.to_string(), tag);
        env
    }

    /// The task tag of the shell sandbox `id`'s spawner keeps waiting for the next command, as
    /// this server asked for it, taken by that command when `runs_there` says it can run there
    /// (asked only where there is such a shell).
    pub(super) fn waiting_tag(&self, id: &str, runs_there: impl FnOnce() -> bool) -> Option<String> {
        let tags = || self.next_tags.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !tags().contains_key(id) || !runs_there() {
            return None;
        }
        tags().remove(id)
    }

    /// Runs `req` like `exec`; with `promotion`, a command still running at its time is adopted by
    /// the task supervisor (when that fails, it is waited for as if nothing had happened).
    pub(super) fn run_exec(
        &self,
        id: &str,
        req: &ExecRequest,
        touch: Touch,
        promotion: Option<&Promotion<'_>>,
    ) -> Result<ExecEnd, ProviderError> {
        let launch = self.launch(id, &req.argv, &req.envs, req.cwd.as_deref().map(Path::new), touch, true)?;
        let spawn = Spawn {
            output_cap: req.output_cap,
            deadline: req.deadline,
            cancel: req.cancel.as_deref(),
            promote_at: promotion.map(|p| p.at),
        };
        let program = req.argv.first().map_or("the command", String::as_str);
        let start_error = |err: io::Error| {
            if !self.dir(id).exists() {
                // Killed or expired between the check above and the start.
                return ProviderError::NotFound { id: id.to_string() };
            }
            let landlock = || self.load(id).is_ok_and(|m| m.isolation == Isolation::Landlock);
            // Refused, or (the spawner going away with the request in its backlog) cut.
            let gone = matches!(
                err.kind(),
                io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound | io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            );
            if gone && landlock() && !self.keeper_alive(id) {
                // No keeper holds the spawner's socket (a Landlock-tier sandbox's): a new one binds it again.
                self.spawn_keeper(id);
                return ProviderError::Unavailable(format!(
                    "could not start {program} in sandbox {id}: its spawner is not running ({err}); its keeper was restarted and starts it: retry in a second"
                ));
            }
            let failed = if landlock() { super::isolation::landlock_spawner::last_failure(&self.dir(id)) } else { None };
            match failed {
                Some(why) => ProviderError::Unavailable(format!(
                    "could not start {program} in sandbox {id}: its spawner could not start ({why}); its keeper tries again every second: kill_sandbox and create another if it keeps failing"
                )),
                None => ProviderError::Unavailable(format!("could not start {program} in sandbox {id}: {err}")),
            }
        };
        let ran = match launch {
            Launch::Host(cmd, inside) => process::run(cmd, &spawn, &self.shell, &self.running, inside),
            Launch::Spawner { to, argv, env, cwd, next_env } => {
                let job = spawner::Job { argv: &argv, env, cwd: cwd.as_deref(), next_env };
                process::run_remote(&to, job, &spawn, &self.running)
            }
        }
        .map_err(start_error)?;
        let handover = match ran {
            Ran::Done(out) => return Ok(ExecEnd::Done(out)),
            Ran::Promoted(handover) => handover,
        };
        let Some(promotion) = promotion else {
            return Err(ProviderError::Unavailable("internal error: a command was handed over without a promotion".into()));
        };
        let lost = |err: io::Error| ProviderError::Unavailable(format!("lost track of the command in sandbox {id}: {err}"));
        match self.adopt(id, req, promotion, &handover) {
            Ok(on_end) => {
                let (stdout, stdout_truncated, stderr, stderr_truncated) = handover.captured();
                let out = ExecOutput {
                    exit_code: 0,
                    stdout: stdout.to_vec(),
                    stderr: stderr.to_vec(),
                    stdout_truncated,
                    stderr_truncated,
                    timed_out: false,
                    duration: handover.elapsed(),
                };
                let budget = req.deadline.saturating_duration_since(Instant::now()) + promotion.kill_grace + Duration::from_secs(30);
                handover.release(budget, on_end);
                Ok(ExecEnd::Promoted(out))
            }
            Err(err) => {
                log::warn!("sandbox {id}: a command could not become task {} ({err}); waiting for it as before", promotion.task_id);
                handover.resume(&spawn).map(ExecEnd::Done).map_err(lost)
            }
        }
    }
}

/// How a command starts in a local sandbox.
pub(super) enum Launch {
    /// As a child of this process; `true` when its pid is also its pid as the sandbox sees it
    /// (no isolation; with `nsenter` it is not).
    Host(Command, bool),
    /// As a child of the sandbox's init, through its spawner's socket; `next_env`: see
    /// [`spawner::Job::next_env`].
    Spawner {
        to: spawner::Endpoint,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: Option<String>,
        next_env: Option<Vec<(String, String)>>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids;
    use crate::provider::local::{isolation::Isolation, ID_PREFIX};
    use crate::provider::{unix_now, Limits};
    use std::fs;

    #[test]
    fn command_runs_in_the_sandbox_environment_and_group() {
        let root = std::env::temp_dir().join(format!("smcp-command-{}", ids::random_hex(4)));
        let p = LocalProvider::new(&root, Path::new("/bin/sh")).unwrap();
        let id = format!("{ID_PREFIX}{}", ids::random_hex(12));
        let home = p.home(&id);
        fs::create_dir_all(home.join("sub")).unwrap();
        let now = unix_now();
        let envs = BTreeMap::from([("A".to_string(), "sandbox".to_string()), ("B".to_string(), "sandbox".to_string())]);
        let meta = Meta {
            sandbox_id: id.clone(),
            template: "base".into(),
            created_at: now,
            timeout: 60,
            expires_at: now + 60,
            envs,
            metadata: BTreeMap::new(),
            isolation: Isolation::None,
            host_network: false,
            policy: Default::default(),
            proxy: false,
            spawner: false,
            limits: Limits::default(),
            owner: None,
        };
        p.store(&meta).unwrap();
        let argv: Vec<String> =
            ["/bin/sh", "-c", r#"pwd; echo "group $$ $(cut -d' ' -f5 /proc/$$/stat)"; env"#].iter().map(|a| a.to_string()).collect();
        let extra = BTreeMap::from([("B".to_string(), "call".to_string())]);
        let out = p.command(&id, &argv, &extra, Some(Path::new("sub")), Touch::Observe).unwrap().output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], home.join("sub").to_str().unwrap(), "{text}");
        let group: Vec<&str> = lines[1].split(' ').collect();
        assert_eq!(group[1], group[2], "the command leads its own process group: {text}");
        for want in ["A=sandbox".to_string(), "B=call".into(), format!("{TAG_VAR}={id}"), format!("HOME={}", home.display())] {
            assert!(lines.contains(&want.as_str()), "{want} missing from {text}");
        }
        assert!(!text.contains("CARGO"), "the host environment leaked: {text}");
        let out = p.command(&id, &argv, &BTreeMap::new(), None, Touch::Observe).unwrap().output().unwrap();
        assert!(String::from_utf8(out.stdout).unwrap().starts_with(&format!("{}\n", home.display())), "the home is the default cwd");
        let rejected = |r: Result<Command, ProviderError>| matches!(r, Err(ProviderError::Rejected(_)));
        assert!(rejected(p.command(&id, &argv, &BTreeMap::new(), Some(Path::new("missing")), Touch::Observe)));
        assert!(rejected(p.command(&id, &argv, &BTreeMap::from([("X=Y".to_string(), String::new())]), None, Touch::Observe)));
        assert!(rejected(p.command(&id, &[], &BTreeMap::new(), None, Touch::Observe)));
        let gone = format!("{ID_PREFIX}{}", ids::random_hex(12));
        assert!(matches!(p.command(&gone, &argv, &BTreeMap::new(), None, Touch::Observe), Err(ProviderError::NotFound { .. })));
        fs::remove_dir_all(&root).unwrap();
    }
}

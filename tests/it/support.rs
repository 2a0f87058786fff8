//! Test harness: temporary state roots, the real binary over stdio and HTTP, polling with
//! deadlines, and cleanup of every sandbox a test created.

#![allow(dead_code)]

use sandbox_mcp::client::StdioClient;
use sandbox_mcp::provider::local::LocalProvider;
use sandbox_mcp::provider::Provider;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// An `initialize` request (protocol 2025-11-25), as the HTTP tests send it.
pub const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

/// Default wait for anything in tests.
pub const TIMEOUT: Duration = Duration::from_secs(20);

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sandbox-mcp"))
}

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// A private state root; every sandbox in it is killed when the test ends.
pub struct Home {
    pub path: PathBuf,
    pub shell: PathBuf,
    /// `--isolation` of the servers this home starts (the product default, `auto`, unless a test
    /// is about running without isolation).
    pub isolation: &'static str,
    /// The uid its servers run as, when not this test process's own (see [`unprivileged_uid`]).
    pub run_as: Option<u32>,
    /// The gid they run as with it (the uid's number unless [`Home::run_as_user`] said).
    pub run_gid: Option<u32>,
}

impl Home {
    /// Servers with the default isolation: namespaces where this host allows them.
    pub fn new(name: &str) -> Home {
        Home::with_shell(name, Path::new("/bin/sh"))
    }

    /// Servers without isolation, for tests of that mode and of host-side facts (host pids, host
    /// paths, mounts under the state root).
    pub fn unisolated(name: &str) -> Home {
        Home::new(name).with_isolation("none")
    }

    /// The same home with servers run as `uid` (the state root becomes theirs).
    pub fn run_as(mut self, uid: u32) -> Home {
        std::os::unix::fs::chown(&self.path, Some(uid), Some(uid)).expect("chown the state root");
        self.run_as = Some(uid);
        self
    }

    /// The same home with servers run as user `uid` with its group `gid` (as a login would start
    /// them: `newuidmap` accepts only its user's own group).
    pub fn run_as_user(mut self, uid: u32, gid: u32) -> Home {
        self = self.run_as(uid);
        std::os::unix::fs::chown(&self.path, Some(uid), Some(gid)).expect("chown the state root");
        self.run_gid = Some(gid);
        self
    }

    /// The same home with servers started as `--isolation mode`.
    pub fn with_isolation(mut self, mode: &'static str) -> Home {
        self.isolation = mode;
        self
    }

    pub fn with_shell(name: &str, shell: &Path) -> Home {
        let path = std::env::temp_dir().join(format!("smcp-test-{name}-{}", sandbox_mcp::ids::random_hex(4)));
        std::fs::create_dir_all(&path).unwrap();
        Home { path, shell: shell.to_path_buf(), isolation: "auto", run_as: None, run_gid: None }
    }

    /// Whether this home's servers are root of their user namespace, and so give each isolated
    /// sandbox a uid of its own: run as root, or as a user with subordinate ids.
    pub fn root_of_its_namespace(&self) -> bool {
        self.run_gid.is_some() || (self.run_as.is_none() && rustix_is_root())
    }

    /// Whether sandboxes of this home's servers are isolated with namespaces.
    pub fn isolated(&self) -> bool {
        (self.isolation == "namespaces" || self.isolation == "auto") && sandbox_mcp::provider::local::isolation::probe().is_ok()
    }

    /// A file a command can create to say it started: its path inside the sandbox (for the
    /// command) and on the host (for the test). Both name the sandbox home in either mode.
    pub fn marker(&self, sandbox_id: &str, name: &str) -> (String, PathBuf) {
        (format!("\"$HOME\"/{name}"), self.sandbox_dir(sandbox_id).join("home").join(name))
    }

    /// The sandbox home as commands inside sandbox `id` see it.
    pub fn inside_home(&self, id: &str) -> String {
        if self.isolated() {
            "/home/user".into()
        } else {
            self.sandbox_dir(id).join("home").display().to_string()
        }
    }

    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("SANDBOX_MCP_HOME".into(), self.path.display().to_string()),
            ("SANDBOX_MCP_LOCAL_SH".into(), self.shell.display().to_string()),
            ("SANDBOX_MCP_PROVIDER".into(), "local".into()),
            ("SANDBOX_MCP_ISOLATION".into(), self.isolation.into()),
            ("RUST_LOG".into(), std::env::var("TEST_RUST_LOG").unwrap_or_else(|_| "warn".into())),
        ]
    }

    pub fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.path.join("sandboxes").join(id)
    }

    pub fn provider(&self) -> LocalProvider {
        LocalProvider::new(&self.path, &self.shell).unwrap()
    }

    /// Starts `sandbox-mcp stdio` and initializes it.
    pub fn stdio(&self) -> Mcp {
        self.stdio_with(&[])
    }

    pub fn stdio_with(&self, extra: &[(&str, &str)]) -> Mcp {
        let mut client = self.spawn_stdio(extra);
        client.initialize().expect("initialize");
        Mcp { client }
    }

    /// Starts `sandbox-mcp stdio` without initializing it.
    pub fn spawn_stdio(&self, extra: &[(&str, &str)]) -> StdioClient {
        let program = if self.run_as.is_some() { shared_bin() } else { bin() };
        StdioClient::start(self.stdio_command(&program, extra), sandbox_mcp::client::Reads::WithTimeouts).expect("spawn server")
    }

    /// The command that runs `program stdio` as this home's servers run (as [`Home::run_as`]'s
    /// uid where set), with this home's environment plus `extra`.
    pub fn stdio_command(&self, program: &Path, extra: &[(&str, &str)]) -> Command {
        let mut cmd = self.command_as_its_user(program);
        cmd.arg("stdio").envs(self.env()).envs(extra.iter().copied());
        cmd
    }

    /// A command that runs `program` as this home's servers run: as [`Home::run_as`]'s uid (and
    /// group) through `setpriv` where set, else as this process.
    pub fn command_as_its_user(&self, program: &Path) -> Command {
        match self.run_as {
            None => Command::new(program),
            Some(uid) => {
                let (id, gid) = (uid.to_string(), self.run_gid.unwrap_or(uid).to_string());
                let mut cmd = Command::new("setpriv");
                cmd.args(["--reuid", &id, "--regid", &gid, "--clear-groups", "--"]).arg(program);
                cmd
            }
        }
    }

    /// A sandbox created by `sandbox-mcp call`, which no session will kill.
    pub fn create_detached(&self, args: Value) -> String {
        let (code, v, err) = self.call_cli("create_sandbox", args);
        assert_eq!(code, 0, "create_sandbox: {err}");
        v["sandbox_id"].as_str().unwrap().to_string()
    }

    /// Runs `sandbox-mcp call TOOL JSON`.
    pub fn call_cli(&self, tool: &str, args: Value) -> (i32, Value, String) {
        let out = Command::new(bin()).args(["call", tool, &args.to_string()]).envs(self.env()).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let value = serde_json::from_str(&stdout).unwrap_or(Value::Null);
        (out.status.code().unwrap_or(-1), value, String::from_utf8_lossy(&out.stderr).to_string())
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A failed test: keep a copy of the state (task directories, supervisor.err) to look at.
            let kept = self.path.with_extension("failed");
            if Command::new("cp").arg("-a").arg(&self.path).arg(&kept).status().is_ok_and(|s| s.success()) {
                eprintln!("the test's state is kept in {}", kept.display());
            }
        }
        let provider = LocalProvider::new(&self.path, &self.shell);
        if let (Ok(p), Ok(dir)) = (provider, std::fs::read_dir(self.path.join("sandboxes"))) {
            for entry in dir.flatten() {
                let id = entry.file_name().to_string_lossy().to_string();
                let _ = p.kill(&id, Instant::now() + Duration::from_secs(5));
            }
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// An initialized stdio server.
pub struct Mcp {
    pub client: StdioClient,
}

impl Mcp {
    pub fn call(&mut self, tool: &str, args: Value) -> Value {
        self.client.call_tool(tool, args, TIMEOUT).unwrap_or_else(|e| panic!("{tool}: {e}"))
    }

    /// Calls a tool that must succeed; returns structuredContent (checked against the text block).
    pub fn ok(&mut self, tool: &str, args: Value) -> Value {
        let r = self.call(tool, args.clone());
        assert_eq!(r["isError"], json!(false), "{tool} {args} failed: {r}");
        let structured = r["structuredContent"].clone();
        let text: Value = serde_json::from_str(r["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(text, structured, "text block must mirror structuredContent");
        structured
    }

    /// Calls a tool that must fail; returns the error text.
    pub fn err(&mut self, tool: &str, args: Value) -> String {
        let r = self.call(tool, args.clone());
        assert_eq!(r["isError"], json!(true), "{tool} {args} should have failed: {r}");
        assert!(r.get("structuredContent").is_none(), "errors carry no structuredContent: {r}");
        r["content"][0]["text"].as_str().unwrap().to_string()
    }

    pub fn request(&mut self, method: &str, params: Value) -> Value {
        self.client.request(method, params, TIMEOUT).unwrap()
    }

    pub fn create(&mut self) -> String {
        self.ok("create_sandbox", json!({}))["sandbox_id"].as_str().unwrap().to_string()
    }

    pub fn close(self) {
        self.client.close(Duration::from_secs(5)).unwrap();
    }
}

/// Polls `f` every 20 ms until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An unprivileged uid to run servers as, for tests that must hold as root and as an ordinary
/// user: when this process is root, the user `smcp-test`, created on first use (a bare uid where
/// `useradd` is missing); `None` when this process is not root (then the suite itself is the
/// unprivileged run).
pub fn unprivileged_uid() -> Option<u32> {
    static UID: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *UID.get_or_init(|| {
        if !rustix_is_root() {
            return None;
        }
        let lookup = || {
            let out = Command::new("id").args(["-u", "smcp-test"]).output().ok()?;
            String::from_utf8_lossy(&out.stdout).trim().parse::<u32>().ok()
        };
        if lookup().is_none() {
            let _ = Command::new("useradd").args(["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "smcp-test"]).status();
        }
        Some(lookup().unwrap_or(4242))
    })
}

/// The first host id of the subordinate ranges ([`subordinate_user`]) the tests give their user
/// `smcp-sub` (65536 ids, outside the default `--uid-range`).
pub const SUBORDINATE_FIRST: u32 = 1_600_000_000;

/// An unprivileged user with subordinate uid and gid ranges (from [`SUBORDINATE_FIRST`]), whose
/// servers give each isolated sandbox an id of its own: when this process is root, the user
/// `smcp-sub`, created on first use with its ranges: (uid, gid). `None` when this process is not
/// root. Panics where util-linux's `useradd`/`usermod` or the `uidmap` package are missing
/// (`.ci/run` installs them).
pub fn subordinate_user() -> Option<(u32, u32)> {
    static USER: std::sync::OnceLock<Option<(u32, u32)>> = std::sync::OnceLock::new();
    *USER.get_or_init(|| {
        if !rustix_is_root() {
            return None;
        }
        assert!(Path::new("/usr/bin/newuidmap").exists(), "newuidmap is missing: install the uidmap package (.ci/run does)");
        let id = |flag: &str| {
            let out = Command::new("id").args([flag, "smcp-sub"]).output().ok()?;
            String::from_utf8_lossy(&out.stdout).trim().parse::<u32>().ok()
        };
        if id("-u").is_none() {
            let made = Command::new("useradd")
                .args(["--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", "smcp-sub"])
                .status();
            assert!(made.is_ok_and(|s| s.success()), "useradd smcp-sub failed");
        }
        // Exactly this range, whatever an earlier run or an operator gave the user.
        let line = format!("smcp-sub:{SUBORDINATE_FIRST}:65536");
        for file in ["/etc/subuid", "/etc/subgid"] {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            if !text.lines().any(|l| l == line) || text.lines().filter(|l| l.starts_with("smcp-sub:")).count() != 1 {
                let kept: String = text.lines().filter(|l| !l.starts_with("smcp-sub:")).map(|l| format!("{l}\n")).collect();
                std::fs::write(file, format!("{kept}{line}\n")).unwrap_or_else(|e| panic!("give smcp-sub subordinate ids in {file}: {e}"));
            }
        }
        Some((id("-u").expect("the uid of smcp-sub"), id("-g").expect("the gid of smcp-sub")))
    })
}

/// A copy of the binary every user can run (the build directory may sit under a private home),
/// made once per test run.
pub fn shared_bin() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("smcp-bin-{}", sandbox_mcp::ids::random_hex(6)));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let copy = dir.join("sandbox-mcp");
        // A hard link where the build directory is on the same file system, else a copy.
        if std::fs::hard_link(bin(), &copy).is_err() {
            std::fs::copy(bin(), &copy).unwrap();
        }
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        copy
    })
    .clone()
}

pub fn rustix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:").map(|r| r.split_whitespace().next() == Some("0"))))
        .unwrap_or(false)
}

/// A `sleep` argument no other process uses (`300.<n>`), so that a test finds that process on
/// the host with [`pid_of_argv`] whatever pid namespace it runs in.
pub fn unique_sleep() -> String {
    format!("300.{}", u32::from_str_radix(&sandbox_mcp::ids::random_hex(3), 16).unwrap())
}

/// Whether host process `pid` is a shell an isolated sandbox keeps waiting for its next command:
/// the waiting command line, its stdin still the pipe its script comes through. (Once it runs a
/// command its stdin is `/dev/null`, and so is that of a subshell it forks, which shows the same
/// command line until it executes something.)
pub fn is_waiting_shell(pid: u32) -> bool {
    let waiting = sandbox_mcp::provider::local::isolation::warm_shell::WAITING.as_bytes();
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let stdin = std::fs::read_link(format!("/proc/{pid}/fd/0")).unwrap_or_default();
    cmd.split(|b| *b == 0).any(|arg| arg == waiting) && stdin.to_string_lossy().starts_with("pipe:")
}

/// Host pids of the live processes whose argv is exactly `argv`.
pub fn pids_of_argv(argv: &[&str]) -> Vec<u32> {
    let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain(std::iter::once(0))).collect();
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            (std::fs::read(e.path().join("cmdline")).ok()? == want && pid_alive(pid)).then_some(pid)
        })
        .collect()
}

/// The host pid of the live process whose argv is exactly `argv`, waiting up to 5 s for it.
pub fn pid_of_argv(argv: &[&str]) -> u32 {
    wait_for(Duration::from_secs(5), &format!("a process {argv:?}"), || pids_of_argv(argv).first().copied())
}

/// Whether a process with this pid exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    sandbox_mcp::provider::process::proc_stat(pid).is_some_and(|st| !matches!(st.state, 'Z' | 'X'))
}

/// `sandbox-mcp http` on a free loopback port.
pub struct Http {
    pub child: Child,
    pub addr: SocketAddr,
    pub stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Http {
    pub fn start(home: &Home, args: &[&str], extra_env: &[(&str, &str)]) -> Http {
        let mut cmd = Command::new(bin());
        cmd.args(["http", "--listen", "127.0.0.1:0"]).args(args);
        Http::spawn(cmd, home, extra_env)
    }

    /// [`Http::start`] with at most `descriptors` open files for the server (soft and hard).
    pub fn start_with_descriptors(home: &Home, descriptors: u32, args: &[&str]) -> Http {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "ulimit -n \"$1\" && shift && exec \"$@\"", "sh", &descriptors.to_string()]);
        cmd.arg(bin()).args(["http", "--listen", "127.0.0.1:0"]).args(args);
        Http::spawn(cmd, home, &[])
    }

    fn spawn(mut cmd: Command, home: &Home, extra_env: &[(&str, &str)]) -> Http {
        cmd.envs(home.env()).env("RUST_LOG", "info");
        cmd.envs(extra_env.iter().copied());
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(rest.split('/').next().unwrap_or("").to_string());
                }
                log2.lock().unwrap().push_str(&line);
                log2.lock().unwrap().push('\n');
            }
        });
        let addr = rx.recv_timeout(TIMEOUT).expect("server did not report its address").parse().unwrap();
        Http { child, addr, stderr: log }
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// One request on a new connection.
    pub fn post(&self, headers: &[(&str, &str)], body: &str) -> Resp {
        let mut conn = Conn::open(self.addr);
        conn.send("POST", "/mcp", headers, body.as_bytes());
        conn.read()
    }

    /// initialize; returns the session id.
    pub fn initialize(&self) -> String {
        let r = self.post(&[], INITIALIZE);
        assert_eq!(r.status, 200, "{}", r.body);
        r.header("mcp-session-id").expect("session id").to_string()
    }

    /// A tools/call in a session; returns the JSON-RPC response.
    pub fn call(&self, session: &str, tool: &str, args: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": tool, "arguments": args}});
        let r = self.post(&[("Mcp-Session-Id", session)], &body.to_string());
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    }

    pub fn stop(mut self) -> std::process::ExitStatus {
        // SIGTERM through the child's own pid (never a group), then wait.
        let _ = Command::new("/bin/sh").args(["-c", &format!("kill -s TERM {}", self.child.id())]).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                return self.child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Http {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A raw HTTP/1.1 keep-alive connection.
pub struct Conn {
    stream: BufReader<TcpStream>,
}

pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// A size field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`), in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let value = status.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')).and_then(|v| v.split_whitespace().next());
    value.unwrap_or_else(|| panic!("no {field} for process {pid}")).parse().unwrap()
}

/// Resident memory of `pid`, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS")
}

/// The peak resident memory of `pid` so far, in KiB.
pub fn peak_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM")
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
}

impl Conn {
    pub fn open(addr: SocketAddr) -> Conn {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        Conn { stream: BufReader::new(s) }
    }

    pub fn from_stream(s: TcpStream) -> Conn {
        Conn { stream: BufReader::new(s) }
    }

    /// Like `read`, but `None` when the answer does not come (read timeout or closed).
    pub fn try_read(&mut self) -> Option<Resp> {
        let mut line = String::new();
        if self.stream.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let status: u16 = line.split_whitespace().nth(1)?.parse().ok()?;
        let mut headers = Vec::new();
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            self.stream.read_line(&mut h).ok()?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':')?;
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().ok()?;
            }
            headers.push((k.to_string(), v.trim().to_string()));
        }
        let mut body = vec![0u8; len];
        self.stream.read_exact(&mut body).ok()?;
        Some(Resp { status, headers, body: String::from_utf8_lossy(&body).to_string() })
    }

    pub fn send(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) {
        let mut head = format!("{method} {path} HTTP/1.1\r\nContent-Length: {}\r\n", body.len());
        let given = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
        for (name, default) in
            [("Host", "127.0.0.1"), ("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")]
        {
            if !given(name) {
                head.push_str(&format!("{name}: {default}\r\n"));
            }
        }
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let s = self.stream.get_mut();
        s.write_all(head.as_bytes()).unwrap();
        // Large bodies may be answered (413) before they are fully sent.
        let _ = s.write_all(body);
    }

    pub fn read(&mut self) -> Resp {
        let mut line = String::new();
        self.stream.read_line(&mut line).unwrap();
        let status: u16 = line.split_whitespace().nth(1).unwrap_or_else(|| panic!("bad status line {line:?}")).parse().unwrap();
        let mut headers = Vec::new();
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            self.stream.read_line(&mut h).unwrap();
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap();
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap();
            }
            headers.push((k.to_string(), v.trim().to_string()));
        }
        let chunked = headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked"));
        let body = if chunked { self.read_chunks() } else { self.read_bytes(len) };
        Resp { status, headers, body: String::from_utf8_lossy(&body).to_string() }
    }

    fn read_bytes(&mut self, len: usize) -> Vec<u8> {
        let mut body = vec![0u8; len];
        self.stream.read_exact(&mut body).unwrap();
        body
    }

    /// A chunked body (tiny_http sends bodies of 32 KiB and more so, on a connection it keeps).
    fn read_chunks(&mut self) -> Vec<u8> {
        let mut body = Vec::new();
        loop {
            let mut size = String::new();
            self.stream.read_line(&mut size).unwrap();
            let size = usize::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16)
                .unwrap_or_else(|e| panic!("chunk size {size:?}: {e}"));
            body.extend(self.read_bytes(size));
            let mut end = String::new();
            self.stream.read_line(&mut end).unwrap();
            if size == 0 {
                return body;
            }
        }
    }
}

/// The `e2b-emulator` binary, built at most once per test run. It is a package of its own in this
/// workspace, so Cargo does not build it for these tests: this runs `cargo build -p
/// e2b-emulator` (a quick no-op when it is up to date, as under `make test`, which builds the
/// workspace first) in the profile of this test binary, then finds it next to the test binary's
/// directory, `target/<profile>/e2b-emulator`.
pub fn emulator_bin() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary's own path");
        // The test binary is target/<profile>/deps/it-<hash>.
        let profile_dir = exe.parent().and_then(Path::parent).expect("the test binary lives in target/<profile>/deps").to_path_buf();
        let mut build = Command::new(env!("CARGO"));
        build.args(["build", "--quiet", "-p", "e2b-emulator"]).current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            build.arg("--release");
        }
        let status = build.status().expect("running cargo to build e2b-emulator");
        assert!(status.success(), "cargo build -p e2b-emulator failed ({status}); fix the build error above");
        let bin = profile_dir.join("e2b-emulator");
        assert!(
            bin.is_file(),
            "{} is missing; the e2b tests start it: run `cargo build -p e2b-emulator` (with --release for release tests)",
            bin.display()
        );
        bin
    })
    .clone()
}

/// The E2B emulator (`e2b-emulator`) on a free loopback port, with a private state root.
pub struct Emulator {
    pub child: Child,
    pub addr: SocketAddr,
    pub home: PathBuf,
}

pub const E2B_TEST_KEY: &str = "e2b_0000000000000000000000000000000000000000";

impl Emulator {
    pub fn start() -> Emulator {
        Emulator::start_with_isolation("none")
    }

    /// An emulator whose local sandboxes are isolated as `isolation` says (`--isolation`: none or
    /// namespaces).
    pub fn start_with_isolation(isolation: &str) -> Emulator {
        Emulator::start_with(isolation, &[])
    }

    /// [`Emulator::start_with_isolation`], with `extra` environment variables.
    pub fn start_with(isolation: &str, extra: &[(&str, &str)]) -> Emulator {
        Emulator::spawn(&["--isolation", isolation], extra)
    }

    /// An emulator whose edge routes envd requests as `routing` says (`--routing`: header, host
    /// or path).
    pub fn start_routed(routing: &str) -> Emulator {
        Emulator::spawn(&["--routing", routing], &[])
    }

    fn spawn(args: &[&str], extra: &[(&str, &str)]) -> Emulator {
        let home = std::env::temp_dir().join(format!("smcp-emulator-{}", sandbox_mcp::ids::random_hex(4)));
        let mut child = Command::new(emulator_bin())
            .args(["--listen", "127.0.0.1:0", "--home", home.to_str().unwrap()])
            .args(args)
            .env("RUST_LOG", "warn")
            .envs(extra.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(rest.trim().trim_end_matches('/').to_string());
                } else {
                    eprintln!("emulator: {line}");
                }
            }
        });
        let addr = rx.recv_timeout(TIMEOUT).expect("the emulator did not report its address").parse().unwrap();
        Emulator { child, addr, home }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// One request to the emulator (control plane or test API); returns (status, JSON body).
    pub fn request(&self, method: &str, path: &str, body: Value) -> (u16, Value) {
        let mut conn = Conn::open(self.addr);
        let text = if body.is_null() { String::new() } else { body.to_string() };
        conn.send(method, path, &[("X-API-KEY", E2B_TEST_KEY), ("Connection", "close")], text.as_bytes());
        let r = conn.read();
        (r.status, serde_json::from_str(&r.body).unwrap_or(Value::Null))
    }

    /// Arms a fault (see the `e2b_emulator` crate, tests/emulator).
    pub fn fault(&self, fault: Value) {
        let (status, body) = self.request("POST", "/_emulator/faults", fault);
        assert_eq!(status, 200, "{body}");
    }

    /// Requests per route since the last reset; resets the counters.
    pub fn take_counts(&self) -> Value {
        let (_, counts) = self.request("GET", "/_emulator/requests", Value::Null);
        self.request("DELETE", "/_emulator/requests", Value::Null);
        counts
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = Command::new("/bin/sh").args(["-c", &format!("kill -s TERM {}", self.child.id())]).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

/// A server configuration that uses the e2b provider against an emulator.
pub struct E2bHome {
    pub emulator: Emulator,
    pub home: Home,
}

impl E2bHome {
    pub fn new(name: &str) -> E2bHome {
        E2bHome { emulator: Emulator::start(), home: Home::new(name) }
    }

    pub fn stdio(&self) -> Mcp {
        self.stdio_with(&[])
    }

    /// A server against the emulator with `extra` environment variables.
    pub fn stdio_with(&self, extra: &[(&str, &str)]) -> Mcp {
        self.server(&self.emulator.url(), extra)
    }

    /// A server whose control plane is the emulator and whose envd URL is `sandbox_url`.
    pub fn stdio_with_envd_at(&self, sandbox_url: &str) -> Mcp {
        self.server(sandbox_url, &[])
    }

    fn server(&self, sandbox_url: &str, extra: &[(&str, &str)]) -> Mcp {
        let url = self.emulator.url();
        let mut env = self.home.env();
        env.retain(|(k, _)| k != "SANDBOX_MCP_PROVIDER");
        let mut all: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        all.extend([
            ("SANDBOX_MCP_PROVIDER", "e2b"),
            ("E2B_API_KEY", E2B_TEST_KEY),
            ("E2B_API_URL", url.as_str()),
            ("E2B_SANDBOX_URL", sandbox_url),
        ]);
        all.extend_from_slice(extra);
        let mut client = StdioClient::spawn(&bin(), &["stdio"], &all, false).expect("spawn server");
        client.initialize().expect("initialize");
        Mcp { client }
    }
}

/// xorshift64*: small and seeded, enough to pick fault points and random inputs. The seed must
/// not be 0.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    /// A delay between `lo` and `hi` milliseconds, both included.
    pub fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// A seed from the environment variable `var` (to replay a run), else from the clock.
pub fn seed(var: &str) -> u64 {
    match std::env::var(var) {
        Ok(s) => s.trim().parse().unwrap_or_else(|_| panic!("{var}={s:?} is not an unsigned integer")),
        Err(_) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1),
    }
}

/// Runs `sandbox-mcp --isolation MODE call ARGS` (ARGS as a shell would split them) on a
/// simulated host that blocks user namespaces: inside a user namespace of this test's own whose
/// `user.max_user_namespaces` is 0.
pub fn call_where_user_namespaces_are_blocked(home: &Home, mode: &str, args: &str) -> std::process::Output {
    let script = format!("echo 0 > /proc/sys/user/max_user_namespaces && exec \"$0\" --isolation {mode} call {args}");
    std::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--", "/bin/sh", "-c", &script])
        .arg(bin())
        .envs(home.env())
        .env_remove("SANDBOX_MCP_ISOLATION")
        .output()
        .unwrap()
}

//! The on-disk record of a local sandbox: `<root>/sandboxes/<id>/meta.json` (0600, written by
//! temp file + rename) and the sandbox's directory and home.

use super::isolation::Isolation;
use super::LocalProvider;
use crate::egress::Network;
use crate::ids;
use crate::provider::{Limits, ProviderError, SandboxInfo};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Persistent description of one sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Meta {
    /// The id.
    pub sandbox_id: String,
    /// Template name.
    pub template: String,
    /// Unix seconds.
    pub created_at: i64,
    /// TTL in seconds, applied again by each renewal.
    pub timeout: u64,
    /// Unix seconds.
    pub expires_at: i64,
    /// Environment of every command.
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    /// Labels.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// How the sandbox is isolated.
    #[serde(default)]
    pub isolation: Isolation,
    /// Whether an isolated sandbox shares the host's network namespace (only sandboxes made
    /// before every isolated sandbox kept a private one).
    #[serde(default)]
    pub host_network: bool,
    /// The network policy its egress proxy enforces.
    #[serde(default)]
    pub policy: Network,
    /// Whether it has an egress proxy (its commands get the proxy variables).
    #[serde(default)]
    pub proxy: bool,
    /// Whether a Landlock-tier sandbox's commands are started by its spawner, all in one
    /// Landlock domain (sandboxes made before it had one confine each command on its own).
    #[serde(default)]
    pub spawner: bool,
    /// Limits enforced with cgroups.
    #[serde(default)]
    pub limits: Limits,
    /// The host uid and gid of an isolated sandbox's root.
    #[serde(default)]
    pub owner: Option<(u32, u32)>,
}

impl Meta {
    /// The network this sandbox's commands have: the host's (reported as `true`) without
    /// isolation or on the host's network, else its policy.
    pub fn network(&self) -> Network {
        if self.isolation == Isolation::None || self.host_network {
            Network::Any
        } else {
            self.policy.clone()
        }
    }

    /// The layers enforced on this sandbox's processes.
    pub fn layers(&self) -> Vec<&'static str> {
        match self.isolation {
            Isolation::Namespaces => super::isolation::namespace_layers(self.host_network),
            Isolation::Landlock => {
                super::isolation::landlock::layers(super::isolation::landlock::abi(), self.owner.is_some(), self.spawner, self.proxy)
            }
            Isolation::None => Vec::new(),
        }
    }

    /// The uid of its own a Landlock-tier sandbox runs as, if any.
    pub fn own_uid(&self) -> Option<u32> {
        match (self.isolation, self.owner) {
            (Isolation::Landlock, Some((uid, _))) => Some(uid),
            _ => None,
        }
    }

    pub(super) fn info(&self) -> SandboxInfo {
        SandboxInfo {
            sandbox_id: self.sandbox_id.clone(),
            template: self.template.clone(),
            expires_at: self.expires_at,
            isolation: self.isolation.name(),
            layers: self.layers(),
            network: self.network(),
            limits: self.limits,
        }
    }
}

impl LocalProvider {
    pub(super) fn dir(&self, id: &str) -> PathBuf {
        self.root.join("sandboxes").join(id)
    }

    pub(super) fn home(&self, id: &str) -> PathBuf {
        self.dir(id).join("home")
    }

    /// Reads a sandbox's metadata.
    pub fn load(&self, id: &str) -> Result<Meta, ProviderError> {
        let path = self.dir(id).join("meta.json");
        let text = match fs::read(&path) {
            Ok(t) => t,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Err(ProviderError::NotFound { id: id.into() }),
            Err(err) => return Err(ProviderError::Unavailable(format!("cannot read {}: {err}", path.display()))),
        };
        serde_json::from_slice(&text)
            .map_err(|err| ProviderError::Unavailable(format!("sandbox {id} has corrupt metadata ({err}); kill it with kill_sandbox")))
    }

    pub(super) fn store(&self, meta: &Meta) -> Result<(), ProviderError> {
        self.store_in(&self.dir(&meta.sandbox_id), meta)
    }

    /// Writes `meta` into `dir` (temp file + rename, mode 0600).
    pub(super) fn store_in(&self, dir: &Path, meta: &Meta) -> Result<(), ProviderError> {
        let tmp = dir.join(format!("meta.json.{}.tmp", ids::random_hex(6)));
        let body = serde_json::to_vec(meta).map_err(|err| ProviderError::Unavailable(format!("cannot encode metadata: {err}")))?;
        let write = || -> io::Result<()> {
            let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
            f.write_all(&body)?;
            fs::rename(&tmp, dir.join("meta.json"))
        };
        write().map_err(|err| {
            let _ = fs::remove_file(&tmp);
            ProviderError::Unavailable(format!("cannot write the metadata of sandbox {}: {err}", meta.sandbox_id))
        })
    }
}

//! STATUS and GC: the operations on a network as a whole, and the listing of the cache.

use std::collections::HashSet;

use serde_json::{Map, Value, json};

use crate::config::at_least;
use crate::validate::{check_network, check_target};
use crate::{CachedAttachment, Cni, Error, GcReport, NetworkList, Target, cache};

impl Cni {
    /// Whether the network's plugins can serve ADDs: every plugin's STATUS, in order; the first
    /// failure is returned (code 50: not available; 51: and existing attachments may have limited
    /// connectivity). Lists older than 1.1.0 have no STATUS, and pass.
    pub async fn status(&self, net: &NetworkList) -> Result<(), Error> {
        if !at_least(&net.cni_version, (1, 1, 0)) {
            return Ok(());
        }
        check_network(net)?;
        for plugin in &net.plugins {
            self.run(net, plugin, "STATUS", None, None, None).await?;
        }
        Ok(())
    }

    /// Garbage-collects the network, with no ADD or DEL running: every cached attachment of the
    /// network not in `valid` (container ID, ifname) is DELeted with the list its ADD used; then,
    /// for 1.1.0 lists without `disableGC`, every plugin's GC gets the valid attachments.
    /// Failures are collected in the report; the error is for a cache that cannot be listed.
    pub async fn gc(
        &self,
        net: &NetworkList,
        valid: &[(String, String)],
    ) -> Result<GcReport, Error> {
        let _exclusive = self.lock.write().await;
        check_network(net)?;
        let mut report = GcReport::default();
        let keep: HashSet<(&str, &str)> = valid
            .iter()
            .map(|(c, i)| (c.as_str(), i.as_str()))
            .collect();
        for entry in cache::list(&self.settings.cache_dir)? {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    tracing::warn!(error = %e, "skipping an unreadable CNI cache entry");
                    continue;
                }
            };
            if entry.network_name != net.name
                || keep.contains(&(entry.container_id.as_str(), entry.ifname.as_str()))
            {
                continue;
            }
            let target = Target {
                container_id: &entry.container_id,
                netns: &entry.netns,
                ifname: &entry.ifname,
                args: &entry.args,
                capability_args: &entry.capability_args,
            };
            let id = (entry.container_id.clone(), entry.ifname.clone());
            let deleted = match check_target(&target) {
                Ok(()) => self.del_cached(net, &entry, &target).await,
                Err(e) => Err(e),
            };
            match deleted {
                Ok(()) => {
                    tracing::info!(network = %net.name, container = %id.0, ifname = %id.1, "CNI GC deleted a stale attachment");
                    report.deleted.push(id);
                }
                Err(e) => report
                    .errors
                    .push(format!("DEL of stale attachment {}/{}: {e}", id.0, id.1)),
            }
        }

        if at_least(&net.cni_version, (1, 1, 0)) && !net.disable_gc {
            let attachments: Vec<Value> = valid
                .iter()
                .map(|(c, i)| json!({"containerID": c, "ifname": i}))
                .collect();
            let attachments = Value::Array(attachments);
            for plugin in &net.plugins {
                let mut extra = Map::new();
                extra.insert("cni.dev/valid-attachments".into(), attachments.clone());
                // The key of the spec's first 1.1.0 text; libcni sends both.
                extra.insert("cni.dev/attachments".into(), attachments.clone());
                if let Err(e) = self.run(net, plugin, "GC", None, None, Some(extra)).await {
                    report.errors.push(e.to_string());
                }
            }
        }
        Ok(report)
    }

    /// Every entry of the cache, of any network; unreadable ones are skipped with a warning.
    /// The cache entry of `container_id`'s attachment `ifname` to network `network`, if there
    /// is one and it reads.
    pub fn cached_entry(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Option<CachedAttachment> {
        let path = cache::entry_path(&self.settings.cache_dir, network, container_id, ifname);
        match cache::read(&path) {
            Ok(entry) => entry,
            Err(e) => {
                tracing::warn!(error = %e, "skipping an unreadable CNI cache entry");
                None
            }
        }
    }

    pub fn cached(&self) -> Vec<CachedAttachment> {
        let entries = match cache::list(&self.settings.cache_dir) {
            Ok(entries) => entries,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the CNI cache");
                return Vec::new();
            }
        };
        entries
            .into_iter()
            .filter_map(|entry| {
                entry
                    .map_err(
                        |e| tracing::warn!(error = %e, "skipping an unreadable CNI cache entry"),
                    )
                    .ok()
            })
            .collect()
    }
}

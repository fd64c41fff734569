//! ADD, DEL and CHECK: the operations on one attachment of a container to a network.

use std::path::PathBuf;

use serde_json::Value;

use crate::config::at_least;
use crate::plugin::plugin_type;
use crate::validate::{check_attachment, check_network};
use crate::{
    Attachment, CachedAttachment, Cni, CniResult, Error, NetworkList, Target, cache, exec,
};

impl Cni {
    /// Attaches the container to the network: every plugin's ADD, in order, each given the result
    /// of the one before as `prevResult`; returns the last one's result.
    ///
    /// First every plugin is asked (VERSION, once per executable) whether it speaks the list's
    /// version. Then the cache entry is written without a result, so an attachment interrupted
    /// half-way is known to GC; it gets the result at the end. When anything fails after that,
    /// the whole list is DELeted (in reverse, without `prevResult`), the entry removed if that
    /// worked (kept for GC if not), and the error of the ADD returned.
    pub async fn add(&self, net: &NetworkList, att: &Attachment) -> Result<CniResult, Error> {
        let _shared = self.lock.read().await;
        check_network(net)?;
        check_attachment(att, true)?;
        for plugin in &net.plugins {
            self.check_plugin_version(net, plugin_type(net, plugin)?)
                .await?;
        }
        let mut entry = CachedAttachment {
            path: self.entry_path(&net.name, att),
            network_name: net.name.clone(),
            container_id: att.container_id.clone(),
            ifname: att.ifname.clone(),
            netns: att.netns.clone(),
            args: att.args.clone(),
            capability_args: att.capability_args.clone(),
            config: net.raw.clone(),
            result: None,
        };
        write_entry(entry.clone()).await?;

        let target = Target::of(att);
        let outcome = match self.add_plugins(net, &target).await {
            Ok(result) => {
                entry.result = Some(result.raw.clone());
                write_entry(entry.clone()).await.map(|()| result)
            }
            Err(e) => Err(e),
        };
        let error = match outcome {
            Ok(result) => return Ok(result),
            Err(e) => e,
        };
        tracing::debug!(network = %net.name, container = %att.container_id, error = %error, "CNI ADD failed; deleting");
        match self.del_plugins(net, &target, None).await {
            Ok(()) => {
                if let Err(e) = remove_entry(entry.path.clone()).await {
                    tracing::warn!(error = %e, "removing the CNI cache entry of a failed ADD");
                }
            }
            Err(del) => tracing::warn!(
                network = %net.name,
                container = %att.container_id,
                ifname = %att.ifname,
                error = %del,
                "DEL after a failed CNI ADD failed too; its cache entry stays for GC"
            ),
        }
        Err(error)
    }

    /// Detaches the container: every plugin's DEL, in reverse order. With a cache entry, the list
    /// is the one the ADD used (whatever the conf dir holds now), `prevResult` its result, and the
    /// CNI_ARGS and capability arguments its own; without one, `net` and `att` as they are. The
    /// entry goes when all succeed. DELs of what was never added, or is gone, succeed (plugins
    /// must make them so).
    pub async fn del(&self, net: &NetworkList, att: &Attachment) -> Result<(), Error> {
        let _shared = self.lock.read().await;
        check_network(net)?;
        check_attachment(att, false)?;
        let path = self.entry_path(&net.name, att);
        let cached = match cache::read(&path) {
            Ok(cached) => cached,
            Err(e) => {
                tracing::warn!(error = %e, "unreadable CNI cache entry; DEL without it");
                None
            }
        };
        match cached {
            Some(entry) => {
                let netns = if att.netns.as_os_str().is_empty() {
                    &entry.netns
                } else {
                    &att.netns
                };
                let target = Target {
                    container_id: &att.container_id,
                    netns,
                    ifname: &att.ifname,
                    args: &entry.args,
                    capability_args: &entry.capability_args,
                };
                self.del_cached(net, &entry, &target).await
            }
            None => {
                self.del_plugins(net, &Target::of(att), None).await?;
                // One may have been written since (a concurrent ADD is the caller's fault).
                remove_entry(path).await.or_else(warn_kept)
            }
        }
    }

    /// Checks the attachment: every plugin's CHECK, in order, with the cached result of the ADD
    /// as `prevResult`. A list older than 0.4.0 cannot be checked (Unsupported); one with
    /// `disableCheck` is not, and passes.
    pub async fn check(&self, net: &NetworkList, att: &Attachment) -> Result<(), Error> {
        if !at_least(&net.cni_version, (0, 4, 0)) {
            return Err(Error::Unsupported {
                plugin: None,
                what: format!(
                    "network {:?} is CNI {}: CHECK needs 0.4.0 or later",
                    net.name, net.cni_version
                ),
            });
        }
        if net.disable_check {
            return Ok(());
        }
        let _shared = self.lock.read().await;
        check_network(net)?;
        check_attachment(att, true)?;
        let entry = cache::read(&self.entry_path(&net.name, att))?;
        let Some(prev) = entry.and_then(|e| e.result) else {
            return Err(Error::NoCachedResult {
                network: net.name.clone(),
                container_id: att.container_id.clone(),
                ifname: att.ifname.clone(),
            });
        };
        let target = Target::of(att);
        for plugin in &net.plugins {
            self.run(net, plugin, "CHECK", Some(&target), Some(&prev), None)
                .await?;
        }
        Ok(())
    }

    async fn add_plugins(
        &self,
        net: &NetworkList,
        target: &Target<'_>,
    ) -> Result<CniResult, Error> {
        let mut last: Option<CniResult> = None;
        for plugin in &net.plugins {
            let prev = last.as_ref().map(|r| &r.raw);
            let out = self
                .run(net, plugin, "ADD", Some(target), prev, None)
                .await?;
            last = Some(parse_result(net, plugin_type(net, plugin)?, out)?);
        }
        last.ok_or_else(|| Error::Config {
            path: net.source.clone(),
            why: "no plugins".to_string(),
        })
    }

    /// DEL of every plugin of `net`, in reverse order.
    async fn del_plugins(
        &self,
        net: &NetworkList,
        target: &Target<'_>,
        prev: Option<&Value>,
    ) -> Result<(), Error> {
        for plugin in net.plugins.iter().rev() {
            self.run(net, plugin, "DEL", Some(target), prev, None)
                .await?;
        }
        Ok(())
    }

    /// DEL of a cached attachment: with the list its ADD used (`net` when that cannot be read) and
    /// its result; the entry goes when it succeeds.
    pub(crate) async fn del_cached(
        &self,
        net: &NetworkList,
        entry: &CachedAttachment,
        target: &Target<'_>,
    ) -> Result<(), Error> {
        let list = match entry.network() {
            Ok(list) if list.name == net.name => list,
            Ok(list) => {
                tracing::warn!(cached = %list.name, network = %net.name, path = %entry.path.display(), "CNI cache entry of another network; DEL with the current list");
                net.clone()
            }
            Err(e) => {
                tracing::warn!(error = %e, "CNI cache entry without a usable list; DEL with the current one");
                net.clone()
            }
        };
        // Cached results on DEL came with 0.4.0 (as libcni).
        let prev = entry
            .result
            .as_ref()
            .filter(|_| at_least(&list.cni_version, (0, 4, 0)));
        self.del_plugins(&list, target, prev).await?;
        remove_entry(entry.path.clone()).await.or_else(warn_kept)
    }
}

/// The result an ADD printed; one without `cniVersion` is taken to be of the list's version (as
/// libcni does).
fn parse_result(
    net: &NetworkList,
    plugin_type: &str,
    out: exec::Output,
) -> Result<CniResult, Error> {
    let stdout = &out.stdout;
    let bad = |why: String| Error::BadOutput {
        plugin: plugin_type.to_string(),
        command: "ADD".to_string(),
        why,
        stderr: out.stderr.clone(),
    };
    let mut value: Value = serde_json::from_slice(stdout).map_err(|e| {
        let shown = String::from_utf8_lossy(&stdout[..stdout.len().min(256)]).into_owned();
        bad(format!("not JSON ({e}): {shown:?}"))
    })?;
    if let Value::Object(obj) = &mut value {
        let versioned = obj
            .get("cniVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| !v.is_empty());
        if !versioned {
            obj.insert("cniVersion".into(), Value::String(net.cni_version.clone()));
        }
    }
    CniResult::from_value(value).map_err(|e| bad(e.why))
}

async fn write_entry(entry: CachedAttachment) -> Result<(), Error> {
    tokio::task::spawn_blocking(move || cache::write(&entry))
        .await
        .map_err(|e| Error::io("writing a CNI cache entry", std::io::Error::other(e)))?
}

async fn remove_entry(path: PathBuf) -> Result<(), Error> {
    tokio::task::spawn_blocking(move || cache::remove(&path))
        .await
        .map_err(|e| Error::io("removing a CNI cache entry", std::io::Error::other(e)))?
}

/// After a successful DEL the entry should go; when it cannot, GC DELs again later.
fn warn_kept(e: Error) -> Result<(), Error> {
    tracing::warn!(error = %e, "CNI DEL done but its cache entry stays");
    Ok(())
}

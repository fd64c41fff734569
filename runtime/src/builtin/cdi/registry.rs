//! The CDI devices of the node: every spec file (`*.json`, `*.yaml`) directly in the spec dirs,
//! read again for each container that asks for a CDI device (the dirs are small, and a spec a
//! driver writes after the agent started must be seen). As in the reference implementation, a
//! spec in a later dir of the list takes priority over one in an earlier dir; two specs of the
//! same dir defining the same device make that device unusable (unless a later dir defines it:
//! the reference implementation drops it then too); a file that cannot be read or is not a
//! valid spec leaves out its devices only, and is named when a device is not found.

use std::collections::HashMap;
use std::path::PathBuf;

use super::Error;
use super::name::QualifiedName;
use super::spec::{self, ContainerEdits, SpecError};

/// One spec file read and checked.
#[derive(Debug)]
struct Loaded {
    path: PathBuf,
    /// The index of its dir in the list: higher wins.
    priority: usize,
    spec: spec::Spec,
}

/// A device found: its spec (an index into `specs`) and its index there.
#[derive(Debug, Clone, Copy)]
struct Found {
    spec: usize,
    device: usize,
}

/// What the spec dirs held when read.
#[derive(Debug, Default)]
pub struct Registry {
    dirs: Vec<PathBuf>,
    specs: Vec<Loaded>,
    devices: HashMap<QualifiedName, Found>,
    /// Devices defined in more than one spec of the same priority, and those specs.
    conflicts: HashMap<QualifiedName, Vec<PathBuf>>,
    /// The files (or dirs) that could not be read, and why.
    problems: Vec<(PathBuf, SpecError)>,
}

/// The edits of one spec or one device, with where they come from (for errors).
#[derive(Debug, Clone)]
pub struct Part {
    /// `vendor/class=name (path)` for a device's edits, `the spec of vendor/class=name (path)`
    /// for its spec's.
    pub origin: String,
    pub edits: ContainerEdits,
}

impl Registry {
    /// Reads every spec file of `dirs` (a missing dir holds none).
    pub fn load(dirs: &[PathBuf]) -> Registry {
        let mut r = Registry {
            dirs: dirs.to_vec(),
            ..Default::default()
        };
        for (priority, dir) in dirs.iter().enumerate() {
            let entries = match std::fs::read_dir(dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    r.problems.push((dir.clone(), SpecError::Read(e)));
                    continue;
                }
            };
            let mut files: Vec<PathBuf> = entries
                .filter_map(|e| e.ok())
                .filter(|e| !e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "json" || x == "yaml"))
                .collect();
            files.sort();
            for path in files {
                match std::fs::read(&path)
                    .map_err(SpecError::Read)
                    .and_then(|data| spec::parse(&path, &data))
                {
                    Ok(spec) => r.add(Loaded {
                        path,
                        priority,
                        spec,
                    }),
                    Err(e) => r.problems.push((path, e)),
                }
            }
        }
        for name in r.conflicts.keys() {
            r.devices.remove(name);
        }
        r
    }

    fn add(&mut self, loaded: Loaded) {
        let index = self.specs.len();
        // A checked spec's kind and device names parse.
        let Ok((vendor, class)) = super::name::parse_kind(&loaded.spec.kind) else {
            return;
        };
        for (i, d) in loaded.spec.devices.iter().enumerate() {
            let name = QualifiedName {
                vendor: vendor.clone(),
                class: class.clone(),
                name: d.name.clone(),
            };
            let found = Found {
                spec: index,
                device: i,
            };
            // The dirs are read in priority order: a later spec is never of a lower one.
            match self.devices.get(&name).map(|f| &self.specs[f.spec]) {
                Some(other) if other.priority == loaded.priority => {
                    let paths = self
                        .conflicts
                        .entry(name)
                        .or_insert_with(|| vec![other.path.clone()]);
                    paths.push(loaded.path.clone());
                }
                _ => {
                    self.conflicts.remove(&name);
                    self.devices.insert(name, found);
                }
            }
        }
        self.specs.push(loaded);
    }

    /// The edits for `names`, in order: for each device, its spec's edits the first time a
    /// device of that spec comes, then the device's own. Every name not found (or defined twice)
    /// is named in the error, with the dirs searched and the files that could not be read.
    pub fn resolve(&self, names: &[QualifiedName]) -> Result<Vec<Part>, Error> {
        let mut parts = Vec::new();
        let mut specs_seen = Vec::new();
        let mut missing = Vec::new();
        for name in names {
            if let Some(paths) = self.conflicts.get(name) {
                return Err(Error::Conflict {
                    device: name.to_string(),
                    specs: paths.iter().map(|p| p.display().to_string()).collect(),
                });
            }
            let Some(found) = self.devices.get(name) else {
                missing.push(name.to_string());
                continue;
            };
            let loaded = &self.specs[found.spec];
            let path = loaded.path.display();
            if !specs_seen.contains(&found.spec) {
                specs_seen.push(found.spec);
                parts.push(Part {
                    origin: format!("the spec of CDI device {name} ({path})"),
                    edits: loaded.spec.container_edits.clone(),
                });
            }
            parts.push(Part {
                origin: format!("CDI device {name} ({path})"),
                edits: loaded.spec.devices[found.device].container_edits.clone(),
            });
        }
        if !missing.is_empty() {
            return Err(Error::NotFound {
                devices: missing,
                dirs: self.dirs_searched(),
                problems: self
                    .problems
                    .iter()
                    .map(|(p, e)| format!("{} {e}", p.display()))
                    .collect(),
            });
        }
        Ok(parts)
    }

    fn dirs_searched(&self) -> String {
        if self.dirs.is_empty() {
            return "no CDI spec dir (nodeletCDISpecDirs is empty)".to_string();
        }
        let dirs: Vec<String> = self.dirs.iter().map(|d| d.display().to_string()).collect();
        format!("the CDI spec dirs {}", dirs.join(", "))
    }
}

//! Names files by (device, inode) for the page-cache report, from the open descriptors and
//! mappings of the traced processes. The kernel's dev_t (major << 20 | minor) differs from
//! the one stat() returns, so both are normalised to (major, minor).
use std::{
    collections::{HashMap, HashSet},
    os::unix::fs::MetadataExt,
    path::PathBuf,
};

pub type FileId = (u32, u32, u64);

/// Splits a kernel-internal dev_t.
pub fn kernel_dev(dev: u32) -> (u32, u32) {
    (dev >> 20, dev & 0xf_ffff)
}

fn user_dev(dev: u64) -> (u32, u32) {
    (libc::major(dev), libc::minor(dev))
}

#[derive(Default)]
pub struct FileNames {
    names: HashMap<FileId, PathBuf>,
    /// Mapped paths already named, by process: a mapping's file does not change under it,
    /// and a process maps each library several times over, so each is looked up once.
    mapped: HashSet<(u32, String)>,
}

/// The CUDA driver library `pid` has mapped, if any: its path in the process's own mount
/// namespace. PyTorch dlopens it at run time, so this is asked again as the job runs.
pub fn cuda_library(maps: &str) -> Option<String> {
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            p.rsplit('/')
                .next()
                .is_some_and(|name| name.starts_with("libcuda.so"))
        })
        .map(str::to_string)
}

impl FileNames {
    /// Records the files `pid` has open or mapped now.
    pub fn scan(&mut self, pid: u32) {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        self.scan_open(pid);
        self.scan_mapped(pid, &maps);
    }

    /// Records the files `pid` has open now.
    pub fn scan_open(&mut self, pid: u32) {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            return;
        };
        let paths: Vec<PathBuf> = dir
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .collect();
        self.remember(pid, paths);
    }

    /// Records the files `pid` maps, from its `maps`; each path once per process.
    pub fn scan_mapped(&mut self, pid: u32, maps: &str) {
        let mut paths = Vec::new();
        for path in maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .filter(|p| p.starts_with('/'))
        {
            if self.mapped.insert((pid, path.to_string())) {
                paths.push(PathBuf::from(path));
            }
        }
        self.remember(pid, paths);
    }

    fn remember(&mut self, pid: u32, paths: Vec<PathBuf>) {
        for path in paths {
            if !path.is_absolute() {
                continue;
            }
            let in_ns = PathBuf::from(format!("/proc/{pid}/root"))
                .join(path.strip_prefix("/").unwrap_or(&path));
            if let Ok(meta) = std::fs::metadata(&in_ns) {
                let (major, minor) = user_dev(meta.dev());
                self.names.entry((major, minor, meta.ino())).or_insert(path);
            }
        }
    }

    pub fn name(&self, kdev: u32, ino: u64) -> Option<String> {
        let (major, minor) = kernel_dev(kdev);
        self.names
            .get(&(major, minor, ino))
            .map(|p| p.display().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_file_this_process_has_open() {
        let path = std::env::temp_dir().join(format!("stallscope-files-{}", std::process::id()));
        std::fs::write(&path, b"x").unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let meta = f.metadata().unwrap();
        let mut names = FileNames::default();
        names.scan(std::process::id());
        let (major, minor) = user_dev(meta.dev());
        let kdev = (major << 20) | minor;
        assert_eq!(
            names.name(kdev, meta.ino()),
            Some(path.display().to_string())
        );
        std::fs::remove_file(&path).unwrap();
    }
}

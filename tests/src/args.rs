//! Hand-rolled argv parsing for `stallwork`: a subcommand followed by `--key value` pairs.
use std::{collections::BTreeMap, io, path::PathBuf, time::Duration};

pub const USAGE: &str = "usage: stallwork <command> [--key value]...
  spin --secs N [--cpu C]          one thread burns CPU (pinned to C if given)
  pinned --cpu C --secs N          two spinning threads pinned to CPU C
  cold-read --file P --mb M --secs N   re-read an evicted file with buffered reads
  sleep --secs N                   one thread sleeping in 10 ms naps
  fork-tree --delay-ms D --secs N  after D ms, fork 2 spinning processes and 2 spinning threads
  churn --delay-ms D --threads N --batch B --burn-ms M [--pause-ms P] --secs S
                                   after D ms, N threads, B at a time, each burning
                                   M ms, then printing its TID and on-CPU time
  demo --secs N [--cpu C]          CPU worker, IO worker and two contending threads
  pingpong --secs N [--cpu C]      two pinned threads bouncing a byte over pipes
  mix --secs N [--threads T]       CPU bursts, naps and small file IO
  cuda-late --lib L --delay-ms D --secs N [--preload P]
  cuda-events --lib L --per-sec R --secs N
                                   after D ms dlopen P (if given) and L, then call L's
                                   cuCtxSynchronize every 10 ms";

/// One workload, with its parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Spin {
        cpu: Option<usize>,
        secs: Duration,
    },
    Pinned {
        cpu: usize,
        secs: Duration,
    },
    ColdRead {
        file: PathBuf,
        mb: u64,
        secs: Duration,
    },
    Sleep {
        secs: Duration,
    },
    ForkTree {
        delay: Duration,
        secs: Duration,
    },
    Churn {
        delay: Duration,
        threads: usize,
        batch: usize,
        burn: Duration,
        /// Between batches.
        pause: Duration,
        secs: Duration,
    },
    Demo {
        cpu: usize,
        secs: Duration,
    },
    PingPong {
        cpu: usize,
        secs: Duration,
        /// Quiet until this file exists, busy for `busy` from then, then quiet again.
        phases: Option<(std::path::PathBuf, Duration)>,
    },
    Mix {
        threads: usize,
        secs: Duration,
    },
    CudaLate {
        lib: String,
        preload: Option<String>,
        delay: Duration,
        secs: Duration,
    },
    CudaEvents {
        lib: String,
        per_sec: u64,
        secs: Duration,
    },
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("{msg}\n{USAGE}"))
}

/// The `--key value` pairs after the subcommand; every key must be consumed.
struct Options {
    values: BTreeMap<String, String>,
}

impl Options {
    fn parse(rest: &[String]) -> io::Result<Self> {
        let mut values = BTreeMap::new();
        let mut it = rest.iter();
        while let Some(key) = it.next() {
            let Some(name) = key.strip_prefix("--") else {
                return Err(invalid(format!("unexpected argument `{key}`")));
            };
            let value = it
                .next()
                .ok_or_else(|| invalid(format!("`{key}` needs a value")))?;
            values.insert(name.to_owned(), value.clone());
        }
        Ok(Self { values })
    }

    fn take<T: std::str::FromStr>(&mut self, name: &str) -> io::Result<Option<T>> {
        let Some(raw) = self.values.remove(name) else {
            return Ok(None);
        };
        raw.parse()
            .map(Some)
            .map_err(|_| invalid(format!("bad value `{raw}` for --{name}")))
    }

    fn need<T: std::str::FromStr>(&mut self, name: &str) -> io::Result<T> {
        self.take(name)?
            .ok_or_else(|| invalid(format!("--{name} is required")))
    }

    fn secs(&mut self) -> io::Result<Duration> {
        let secs: f64 = self.need("secs")?;
        Duration::try_from_secs_f64(secs).map_err(|_| invalid(format!("bad --secs {secs}")))
    }

    /// Rejects leftovers, so that a typo is an error rather than a silently ignored flag.
    fn finish(self) -> io::Result<()> {
        match self.values.keys().next() {
            Some(k) => Err(invalid(format!("unknown option --{k}"))),
            None => Ok(()),
        }
    }
}

/// Parses `stallwork`'s arguments, without the program name.
pub fn parse(argv: &[String]) -> io::Result<Command> {
    let (name, rest) = argv
        .split_first()
        .ok_or_else(|| invalid("no command given".to_owned()))?;
    let mut o = Options::parse(rest)?;
    let command = match name.as_str() {
        "spin" => Command::Spin {
            cpu: o.take("cpu")?,
            secs: o.secs()?,
        },
        "pinned" => Command::Pinned {
            cpu: o.need("cpu")?,
            secs: o.secs()?,
        },
        "cold-read" => Command::ColdRead {
            file: o.need("file")?,
            mb: o.need("mb")?,
            secs: o.secs()?,
        },
        "sleep" => Command::Sleep { secs: o.secs()? },
        "fork-tree" => Command::ForkTree {
            delay: Duration::from_millis(o.need("delay-ms")?),
            secs: o.secs()?,
        },
        "churn" => Command::Churn {
            delay: Duration::from_millis(o.need("delay-ms")?),
            threads: o.need("threads")?,
            batch: o.need("batch")?,
            burn: Duration::from_millis(o.need("burn-ms")?),
            pause: Duration::from_millis(o.take("pause-ms")?.unwrap_or(0)),
            secs: o.secs()?,
        },
        "demo" => Command::Demo {
            cpu: o.take("cpu")?.unwrap_or(0),
            secs: o.secs()?,
        },
        "pingpong" => Command::PingPong {
            cpu: o.take("cpu")?.unwrap_or(0),
            secs: o.secs()?,
            phases: match (o.take("go-file")?, o.take::<u64>("busy-ms")?) {
                (Some(file), Some(ms)) => Some((file, Duration::from_millis(ms))),
                (None, None) => None,
                _ => return Err(invalid("--go-file and --busy-ms go together".to_owned())),
            },
        },
        "mix" => Command::Mix {
            threads: o.take("threads")?.unwrap_or(4),
            secs: o.secs()?,
        },
        "cuda-late" => Command::CudaLate {
            lib: o.need("lib")?,
            preload: o.take("preload")?,
            delay: Duration::from_millis(o.need("delay-ms")?),
            secs: o.secs()?,
        },
        "cuda-events" => Command::CudaEvents {
            lib: o.need("lib")?,
            per_sec: o.need("per-sec")?,
            secs: o.secs()?,
        },
        other => return Err(invalid(format!("unknown command `{other}`"))),
    };
    o.finish()?;
    Ok(command)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn parses_every_command() {
        assert_eq!(
            parse(&argv("pinned --cpu 1 --secs 2.5")).unwrap(),
            Command::Pinned {
                cpu: 1,
                secs: Duration::from_millis(2500)
            }
        );
        assert_eq!(
            parse(&argv("fork-tree --secs 3 --delay-ms 200")).unwrap(),
            Command::ForkTree {
                delay: Duration::from_millis(200),
                secs: Duration::from_secs(3)
            }
        );
        assert_eq!(
            parse(&argv("spin --secs 1 --cpu 1")).unwrap(),
            Command::Spin {
                cpu: Some(1),
                secs: Duration::from_secs(1)
            }
        );
        assert_eq!(
            parse(&argv(
                "churn --delay-ms 5 --threads 9 --batch 3 --burn-ms 2 --secs 1"
            ))
            .unwrap(),
            Command::Churn {
                delay: Duration::from_millis(5),
                threads: 9,
                batch: 3,
                burn: Duration::from_millis(2),
                pause: Duration::ZERO,
                secs: Duration::from_secs(1)
            }
        );
        assert_eq!(
            parse(&argv("pingpong --secs 1")).unwrap(),
            Command::PingPong {
                cpu: 0,
                secs: Duration::from_secs(1),
                phases: None,
            }
        );
    }

    #[test]
    fn rejects_mistakes() {
        for bad in [
            "",
            "spin",
            "spin --secs",
            "spin --secs x",
            "spin --secs 1 --cpu x",
            "sleep --secs 1 --cpu 2",
            "spin secs 1",
            "jump --secs 1",
            "spin --secs -1",
        ] {
            assert!(parse(&argv(bad)).is_err(), "accepted `{bad}`");
        }
    }
}

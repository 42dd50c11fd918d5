//! What a package installs beside the binary, made from the CLI's own definition so they
//! never disagree with it: shell completions and man pages.
use std::path::Path;

use anyhow::Context as _;
use clap::CommandFactory as _;

use crate::cli::Cli;

pub fn print_completions(shell: clap_complete::Shell) -> anyhow::Result<i32> {
    let mut cmd = Cli::command();
    clap_complete::generate(shell, &mut cmd, "stallscope", &mut std::io::stdout().lock());
    Ok(0)
}

/// `stallscope.1`, and `stallscope-COMMAND.1` for each visible command.
pub fn write_manpages(dir: &Path) -> anyhow::Result<i32> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let cmd = Cli::command();
    let mut written = Vec::new();
    let mut write = |name: String, cmd: clap::Command| -> anyhow::Result<()> {
        let path = dir.join(format!("{name}.1"));
        let mut roff = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut roff)?;
        std::fs::write(&path, roff).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
        Ok(())
    };
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("stallscope-{}", sub.get_name());
        // clap keeps names as &'static str; this command runs once and exits.
        let title: &'static str = Box::leak(name.clone().into_boxed_str());
        write(
            name,
            sub.clone().name(title).version(env!("CARGO_PKG_VERSION")),
        )?;
    }
    write("stallscope".into(), cmd)?;
    for p in written {
        eprintln!("stallscope: wrote {}", p.display());
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bash_completion_offers_every_command_and_record_flags() {
        let mut out = Vec::new();
        clap_complete::generate(
            clap_complete::Shell::Bash,
            &mut Cli::command(),
            "stallscope",
            &mut out,
        );
        let script = String::from_utf8(out).unwrap();
        for word in [
            "record", "report", "diff", "check", "doctor", "agent", "--pid",
        ] {
            assert!(
                script.contains(word),
                "{word} missing from the bash completion"
            );
        }
    }

    #[test]
    fn man_pages_name_each_command_and_its_options() {
        let dir = std::env::temp_dir().join(format!("stallscope-man-{}", std::process::id()));
        write_manpages(&dir).unwrap();
        let main = std::fs::read_to_string(dir.join("stallscope.1")).unwrap();
        assert!(main.contains(".TH stallscope 1"), "{}", &main[..200]);
        assert!(
            main.contains("stallscope\\-record(1)"),
            "no see-also of record's page"
        );
        let record = std::fs::read_to_string(dir.join("stallscope-record.1")).unwrap();
        assert!(record.contains("\\-\\-pid"), "record's page lacks --pid");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

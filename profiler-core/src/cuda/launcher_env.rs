//! Ranks from the launcher's environment, for processes whose communicator was made before
//! the probes attached.
use super::view::RankInfo;

/// A rank from launcher variables: torchrun's RANK/WORLD_SIZE, Open MPI's, PMI's or Slurm's.
pub fn rank_from_env(vars: &[(String, String)]) -> Option<RankInfo> {
    let get = |names: &[&str]| {
        names.iter().find_map(|n| {
            vars.iter()
                .find(|(k, _)| k == n)
                .and_then(|(_, v)| v.parse::<u32>().ok())
        })
    };
    Some(RankInfo {
        rank: get(&["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"])?,
        nranks: get(&[
            "WORLD_SIZE",
            "OMPI_COMM_WORLD_SIZE",
            "PMI_SIZE",
            "SLURM_NTASKS",
        ])
        .unwrap_or(0),
        comm_id: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_come_from_launcher_variables() {
        let v = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, x)| (k.to_string(), x.to_string()))
                .collect()
        };
        let r = rank_from_env(&v(&[("WORLD_SIZE", "8"), ("RANK", "3")])).unwrap();
        assert_eq!((r.rank, r.nranks), (3, 8));
        let r = rank_from_env(&v(&[("SLURM_PROCID", "5")])).unwrap();
        assert_eq!((r.rank, r.nranks), (5, 0));
        assert!(rank_from_env(&v(&[("LOCAL_RANK", "1"), ("RANK", "x")])).is_none());
    }
}

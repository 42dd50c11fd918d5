//! Joining a sample's Python frames into its native stack, as py-spy `--native` does: each
//! native frame of the interpreter loop is replaced by the Python frames it was evaluating.

/// Whether a native frame is a C call of CPython's interpreter loop: the frames it evaluates
/// replace it (`.cold` is the same call, in its cold part).
pub fn is_eval_frame(name: &str) -> bool {
    name.strip_prefix("_PyEval_EvalFrameDefault")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// The Python frames of one sample, innermost first, cut into the runs that one C call of
/// the interpreter loop evaluates each (innermost run first, each run innermost first).
/// `outermost` marks a frame that ends its run.
pub fn runs(frames: impl IntoIterator<Item = (String, bool)>) -> Vec<Vec<String>> {
    let mut runs = vec![Vec::new()];
    for (name, outermost) in frames {
        runs.last_mut().expect("never empty").push(name);
        if outermost {
            runs.push(Vec::new());
        }
    }
    runs.retain(|r| !r.is_empty());
    runs
}

/// `native` (root first; its first `user_len` frames are user space) with its interpreter
/// loop frames replaced by `runs`, the innermost loop frame by the innermost run. Runs left
/// over (the native walk stopped before reaching their loop frames) go at the root, so the
/// Python stack stays whole; loop frames left over stay native.
pub fn merge(native: &[String], user_len: usize, runs: &[Vec<String>]) -> Vec<String> {
    let user_len = user_len.min(native.len());
    let evals: Vec<usize> = (0..user_len)
        .filter(|&i| is_eval_frame(&native[i]))
        .collect();
    // Leaf-most loop frame first, paired with the innermost run.
    let mut paired = vec![None; native.len()];
    for (k, &i) in evals.iter().rev().enumerate() {
        if let Some(run) = runs.get(k) {
            paired[i] = Some(run);
        }
    }
    let mut out = Vec::with_capacity(native.len() + runs.iter().map(Vec::len).sum::<usize>());
    for run in runs.iter().skip(evals.len()).rev() {
        out.extend(run.iter().rev().cloned());
    }
    for (i, frame) in native.iter().enumerate() {
        match paired[i] {
            Some(run) => out.extend(run.iter().rev().cloned()),
            None => out.push(frame.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn runs_split_after_each_outermost_frame() {
        let r = runs([
            ("leaf".to_string(), false),
            ("mid".to_string(), true),
            ("outer".to_string(), true),
        ]);
        assert_eq!(r, vec![s(&["leaf", "mid"]), s(&["outer"])]);
        assert!(runs(Vec::new()).is_empty());
    }

    #[test]
    fn each_loop_frame_becomes_the_frames_it_evaluated() {
        let native = s(&[
            "_start",
            "Py_RunMain",
            "_PyEval_EvalFrameDefault",
            "_PyObject_Call",
            "_PyEval_EvalFrameDefault",
            "time_sleep",
            "clock_nanosleep",
        ]);
        let runs = vec![
            s(&["sleepy (a.py:3)", "caller (a.py:9)"]),
            s(&["<module> (a.py:12)"]),
        ];
        assert_eq!(
            merge(&native, 6, &runs),
            s(&[
                "_start",
                "Py_RunMain",
                "<module> (a.py:12)",
                "_PyObject_Call",
                "caller (a.py:9)",
                "sleepy (a.py:3)",
                "time_sleep",
                "clock_nanosleep",
            ])
        );
    }

    #[test]
    fn runs_the_native_walk_never_reached_go_at_the_root() {
        let native = s(&["[unknown]", "_PyEval_EvalFrameDefault", "burn"]);
        let runs = vec![s(&["inner (a.py:1)"]), s(&["outer (a.py:2)"])];
        assert_eq!(
            merge(&native, 3, &runs),
            s(&["outer (a.py:2)", "[unknown]", "inner (a.py:1)", "burn"])
        );
    }

    #[test]
    fn loop_frames_without_python_frames_stay_and_kernel_frames_are_never_replaced() {
        let native = s(&[
            "_PyEval_EvalFrameDefault",
            "_PyEval_EvalFrameDefault.cold",
            "_PyEval_EvalFrameDefault",
        ]);
        let runs = vec![s(&["f (a.py:1)"])];
        assert_eq!(
            merge(&native, 2, &runs),
            s(&[
                "_PyEval_EvalFrameDefault",
                "f (a.py:1)",
                "_PyEval_EvalFrameDefault"
            ])
        );
        assert!(!is_eval_frame("_PyEval_EvalFrameDefaultX"));
    }
}

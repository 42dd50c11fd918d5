//! The page holds its data, its script and nothing from the network.
use super::*;
use crate::Report;
use crate::attribution::attribute;
use crate::timeline::{TimelineEvents, build};

const DDP: &[u8] = include_bytes!("../../../tests/recordings/gpu/v1-nccl-straggler-ddp.rec");

fn page() -> String {
    let (folded, load) = crate::load_reader(DDP).unwrap();
    let attribution = attribute(&folded.analysis, &folded.timed).unwrap();
    let events = TimelineEvents::keep(folded.timed.clone(), 50_000_000);
    let lanes = build("ddp.rec", &folded.analysis, Some(&attribution), events);
    let report = Report::new(&folded.analysis, Some(&attribution), &load);
    let graphs = [Flamegraph {
        name: "oncpu".into(),
        svg: "<svg><script>var x = '</script>';</script></svg>".into(),
    }];
    let mut out = Vec::new();
    write_page(Subject::One(&report), &[lanes], &graphs, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn data(page: &str) -> Value {
    let start = page.find("id=\"stallscope-data\">").unwrap() + "id=\"stallscope-data\">".len();
    let end = start + page[start..].find("</script>").unwrap();
    serde_json::from_str(&page[start..end]).unwrap()
}

#[test]
fn the_data_survives_the_page_and_nothing_is_fetched() {
    let page = page();
    for far in ["http://", "https://", "src=\"", "<link"] {
        let hits: Vec<usize> = page.match_indices(far).map(|(i, _)| i).collect();
        // Only the data may mention an address (an inferno SVG's xmlns).
        let script = page.find("id=\"stallscope-data\"").unwrap();
        let data_end = script + page[script..].find("</script>").unwrap();
        assert!(
            hits.iter().all(|&i| i > script && i < data_end),
            "{far} outside the data"
        );
    }
    let d = data(&page);
    assert_eq!(
        d["flamegraphs"][0]["svg"],
        "<svg><script>var x = '</script>';</script></svg>"
    );
    let rec = &d["recordings"][0];
    assert_eq!(rec["gpus"].as_array().unwrap().len(), 4);
    assert!(
        rec["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["is_rank"] == true)
            .count()
            == 4
    );
    assert_eq!(d["report"]["gpus"].as_array().unwrap().len(), 4);
}

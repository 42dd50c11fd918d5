//! The formats `report` and `record` print on stdout, by name.
use super::model::Render;

/// The formats `report` and `record` print.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    #[default]
    Text,
    Json,
}

impl Format {
    pub const ALL: [Format; 2] = [Format::Text, Format::Json];

    pub fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Json => "json",
        }
    }

    pub fn renderer(self) -> &'static dyn Render {
        match self {
            Format::Text => &super::text::Text,
            Format::Json => &super::json::Json,
        }
    }
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Format::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Format::ALL.iter().map(|f| f.name()).collect();
                format!("unknown format {s:?}; one of: {}", names.join(", "))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_by_name_and_refuse_others() {
        for f in Format::ALL {
            assert_eq!(f.name().parse::<Format>(), Ok(f));
        }
        let e = "yaml".parse::<Format>().unwrap_err();
        assert!(e.contains("text, json"), "{e}");
    }
}

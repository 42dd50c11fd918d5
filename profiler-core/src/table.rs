//! Plain-text tables with per-column alignment, for the text report.
use std::io::{self, Write};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// Columns are separated by two spaces; widths fit the widest cell (in characters).
pub struct Table {
    columns: Vec<(&'static str, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(columns: &[(&'static str, Align)]) -> Self {
        Self {
            columns: columns.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells are blank and extra cells are dropped.
    pub fn row(&mut self, mut cells: Vec<String>) {
        cells.resize(self.columns.len(), String::new());
        self.rows.push(cells);
    }

    /// Writes the header and rows, each line prefixed by `indent`.
    pub fn write<W: Write>(&self, indent: &str, w: &mut W) -> io::Result<()> {
        let mut widths: Vec<usize> = self
            .columns
            .iter()
            .map(|(h, _)| h.chars().count())
            .collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let header: Vec<String> = self.columns.iter().map(|(h, _)| (*h).to_owned()).collect();
        for cells in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::from(indent);
            for (i, ((_, align), cell)) in self.columns.iter().zip(cells).enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = widths[i].saturating_sub(cell.chars().count());
                match align {
                    Align::Left => {
                        line.push_str(cell);
                        line.extend(std::iter::repeat_n(' ', pad));
                    }
                    Align::Right => {
                        line.extend(std::iter::repeat_n(' ', pad));
                        line.push_str(cell);
                    }
                }
            }
            writeln!(w, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

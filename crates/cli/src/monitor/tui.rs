//! The live view of `rserpool monitor` (ratatui on crossterm): the panes of [`super::model`]
//! as tables, redrawn every refresh and on every key. Keys: q or Esc quits, Tab / → and
//! Shift-Tab / ← move between panes, ↑ ↓ PgUp PgDn Home End move within the focused pane.

use super::model::{panes, Pane, State};
use anyhow::Result;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table, TableState};
use ratatui::Frame;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Which pane has the focus and where each is scrolled.
struct View {
    focus: usize,
    tables: Vec<TableState>,
}

impl View {
    fn new(n: usize) -> Self {
        View {
            focus: 0,
            tables: (0..n).map(|_| TableState::default()).collect(),
        }
    }

    /// Handles a key; false when the view should end.
    fn key(&mut self, code: KeyCode, modifiers: KeyModifiers, rows: &[usize]) -> bool {
        let n = self.tables.len();
        let len = rows.get(self.focus).copied().unwrap_or(0);
        let t = &mut self.tables[self.focus];
        let at = t.selected().unwrap_or(0);
        match code {
            KeyCode::Char('q') | KeyCode::Esc => return false,
            KeyCode::Char('c') if modifiers.contains(KeyModifiers::CONTROL) => return false,
            KeyCode::Tab | KeyCode::Right => self.focus = (self.focus + 1) % n,
            KeyCode::BackTab | KeyCode::Left => self.focus = (self.focus + n - 1) % n,
            KeyCode::Down | KeyCode::Char('j') if len > 0 => t.select(Some((at + 1).min(len - 1))),
            KeyCode::Up | KeyCode::Char('k') if len > 0 => t.select(Some(at.saturating_sub(1))),
            KeyCode::PageDown if len > 0 => t.select(Some((at + 10).min(len - 1))),
            KeyCode::PageUp if len > 0 => t.select(Some(at.saturating_sub(10))),
            KeyCode::Home => t.select(Some(0)),
            KeyCode::End if len > 0 => t.select(Some(len - 1)),
            _ => {}
        }
        true
    }
}

/// Column widths from the contents, the last column taking what is left.
fn widths(p: &Pane) -> Vec<Constraint> {
    let n = p.header.len();
    (0..n)
        .map(|i| {
            if i + 1 == n {
                return Constraint::Fill(1);
            }
            let w = p
                .rows
                .iter()
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .chain(std::iter::once(p.header[i].chars().count()))
                .max()
                .unwrap_or(0);
            Constraint::Length(w.min(64) as u16)
        })
        .collect()
}

fn draw_pane(f: &mut Frame, area: Rect, p: &Pane, focused: bool, state: &mut TableState) {
    let border = if focused {
        Style::default()
            .fg(Color::Yellow)
            .add_modifier(Modifier::BOLD)
    } else {
        Style::default()
    };
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(border)
        .title(format!(" {} ({}) ", p.title, p.rows.len()));
    if p.rows.is_empty() {
        f.render_widget(Paragraph::new("(none)").block(block), area);
        return;
    }
    let header = Row::new(p.header.iter().map(|h| Cell::from(*h)))
        .style(Style::default().add_modifier(Modifier::BOLD | Modifier::UNDERLINED));
    let rows = p
        .rows
        .iter()
        .map(|r| Row::new(r.iter().map(|c| Cell::from(c.as_str()))));
    let table = Table::new(rows, widths(p))
        .header(header)
        .block(block)
        .column_spacing(2)
        .row_highlight_style(if focused {
            Style::default().add_modifier(Modifier::REVERSED)
        } else {
            Style::default()
        });
    f.render_stateful_widget(table, area, state);
}

fn draw(f: &mut Frame, all: &[Pane], view: &mut View, footer: &str) {
    let [title, top, middle, pes, bottom, keys] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Fill(1),
        Constraint::Fill(1),
        Constraint::Fill(2),
        Constraint::Fill(2),
        Constraint::Length(1),
    ])
    .areas(f.area());
    let [pools, sessions] =
        Layout::horizontal([Constraint::Fill(1), Constraint::Fill(2)]).areas(middle);
    let count = |i: usize| all.get(i).map_or(0, |p| p.rows.len());
    f.render_widget(
        Paragraph::new(Line::from(format!(
            "rserpool monitor: {} registrar(s), {} pool(s), {} PE(s), {} session(s)",
            count(0),
            count(1),
            count(2),
            count(3)
        )))
        .style(Style::default().add_modifier(Modifier::BOLD)),
        title,
    );
    // Pane order: registrars, pools, PEs, sessions, counters.
    let areas = [top, pools, pes, sessions, bottom];
    for (i, (p, area)) in all.iter().zip(areas).enumerate() {
        draw_pane(f, area, p, view.focus == i, &mut view.tables[i]);
    }
    f.render_widget(
        Paragraph::new(format!(
            "q quit · Tab/←→ pane · ↑↓ PgUp PgDn move · {footer}"
        ))
        .style(Style::default().fg(Color::DarkGray)),
        keys,
    );
}

/// Runs the view until q, Esc or Ctrl-C; restores the terminal whatever happens.
pub(super) fn run(state: Arc<Mutex<State>>, refresh: Duration, footer: String) -> Result<()> {
    let mut terminal = ratatui::try_init()?;
    let result = (|| -> Result<()> {
        let mut view = View::new(5);
        let mut next_draw = std::time::Instant::now();
        let mut all: Vec<Pane> = Vec::new();
        loop {
            if std::time::Instant::now() >= next_draw {
                all = match state.lock() {
                    Ok(st) => panes(&st, Instant::now()),
                    Err(_) => anyhow::bail!("the monitor's state is poisoned"),
                };
                terminal.draw(|f| draw(f, &all, &mut view, &footer))?;
                next_draw = std::time::Instant::now() + refresh.min(Duration::from_secs(1));
            }
            let wait = next_draw.saturating_duration_since(std::time::Instant::now());
            if event::poll(wait)? {
                match event::read()? {
                    Event::Key(k) if k.kind != KeyEventKind::Release => {
                        let rows: Vec<usize> = all.iter().map(|p| p.rows.len()).collect();
                        if !view.key(k.code, k.modifiers, &rows) {
                            return Ok(());
                        }
                        terminal.draw(|f| draw(f, &all, &mut view, &footer))?;
                    }
                    Event::Resize(..) => {
                        terminal.draw(|f| draw(f, &all, &mut view, &footer))?;
                    }
                    _ => {}
                }
            }
        }
    })();
    ratatui::restore();
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    #[test]
    fn panes_draw_and_keys_move_the_focus() {
        let p = |title: &str, rows: Vec<Vec<String>>| Pane {
            title: title.into(),
            header: vec!["A", "B"],
            rows,
        };
        let all = vec![
            p("Registrars", vec![vec!["$0000abcd".into(), "x".into()]]),
            p("Pools", vec![]),
            p(
                "Pool elements",
                vec![vec!["$00000001".into(), "EchoPool".into()]; 3],
            ),
            p("Sessions", vec![]),
            p("Receipts and counters", vec![]),
        ];
        let mut view = View::new(5);
        let mut t = Terminal::new(TestBackend::new(100, 40)).unwrap();
        t.draw(|f| draw(f, &all, &mut view, "refresh 1s")).unwrap();
        let screen: String = t
            .backend()
            .buffer()
            .content()
            .iter()
            .map(|c| c.symbol())
            .collect();
        assert!(screen.contains("$0000abcd"), "{screen}");
        assert!(screen.contains("Pool elements (3)"), "{screen}");
        let rows: Vec<usize> = all.iter().map(|p| p.rows.len()).collect();
        assert!(view.key(KeyCode::Tab, KeyModifiers::NONE, &rows));
        assert!(view.key(KeyCode::Right, KeyModifiers::NONE, &rows));
        assert_eq!(view.focus, 2);
        for _ in 0..5 {
            view.key(KeyCode::Down, KeyModifiers::NONE, &rows);
        }
        assert_eq!(view.tables[2].selected(), Some(2), "stops at the last row");
        assert!(view.key(KeyCode::BackTab, KeyModifiers::NONE, &rows));
        assert_eq!(view.focus, 1);
        assert!(!view.key(KeyCode::Char('q'), KeyModifiers::NONE, &rows));
    }
}

//! docs/cli.md, the command-line reference, is generated from the commands' own help so that it
//! cannot drift from them: the test below fails when the file is not what the help says now,
//! and `UPDATE_DOCS=1 cargo test -p rserpool-cli --bin rserpool cli_reference` rewrites it.

use clap::{Command, CommandFactory};

/// The reference as Markdown: every command's long help, at a fixed width, with environment
/// values hidden (the text must not depend on who generates it).
fn render() -> String {
    let mut root = fixed(crate::Cli::command());
    root.build();
    let mut out = String::from(
        "# Command-line reference\n\n\
         Generated from the commands' own `--help` (`UPDATE_DOCS=1 cargo test -p rserpool-cli \
         --bin rserpool cli_reference` rewrites it; CI fails when it is not current). Settings \
         and their TOML keys: [configuration.md](configuration.md).\n",
    );
    section(&mut out, &mut root, "rserpool");
    let names: Vec<String> = root
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .filter(|name| name != "help")
        .collect();
    for name in names {
        let sub = root
            .find_subcommand_mut(&name)
            .expect("a subcommand just listed");
        section(&mut out, sub, &format!("rserpool {name}"));
    }
    out
}

/// The command with a fixed help width and hidden environment values, its subcommands too.
fn fixed(c: Command) -> Command {
    c.term_width(100)
        .max_term_width(100)
        .mut_args(|a| a.hide_env_values(true))
        .mut_subcommands(fixed)
}

fn section(out: &mut String, c: &mut Command, title: &str) {
    let help = c.render_long_help().to_string();
    let help: Vec<&str> = help.lines().map(str::trim_end).collect();
    out.push_str(&format!(
        "\n## `{title}`\n\n```text\n{}\n```\n",
        help.join("\n").trim_end()
    ));
}

#[test]
fn cli_reference_is_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cli.md");
    let now = render();
    if std::env::var("UPDATE_DOCS").as_deref() == Ok("1") {
        std::fs::write(path, &now).expect("docs/cli.md is writable");
        return;
    }
    let on_disk = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        on_disk == now,
        "docs/cli.md is not the commands' current help: run \
         `UPDATE_DOCS=1 cargo test -p rserpool-cli --bin rserpool cli_reference` and commit it"
    );
}

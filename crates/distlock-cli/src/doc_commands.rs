//! Every `distlock` command shown in the README and docs/ parses with this build's flags: a
//! renamed or removed flag fails here, not in a reader's shell. The commands are taken from the
//! shell blocks (```sh, ```bash, ```console) and from the `$ distlock …` lines of text blocks;
//! usage synopses (with `[…]`) are written in text blocks without a `$`, and are not commands.

use clap::Parser;
use std::path::{Path, PathBuf};

/// The markdown files a reader sees: the README and docs/ (not the generated reference).
fn pages() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut pages = vec![root.join("README.md"), root.join("CONTRIBUTING.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") && !path.ends_with("cli-reference.md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages
}

/// The `distlock` commands of a page, with their line numbers.
fn commands(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut fence: Option<String> = None;
    let mut pending: Option<(usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        if let Some(tag) = line.trim_start().strip_prefix("```") {
            fence = if fence.is_some() { None } else { Some(tag.trim().to_string()) };
            continue;
        }
        let Some(tag) = &fence else { continue };
        if let Some((at, mut joined)) = pending.take() {
            joined.push_str(line.trim());
            match joined.strip_suffix('\\') {
                Some(more) => pending = Some((at, more.to_string())),
                None => found.push((at, joined)),
            }
            continue;
        }
        let shell = matches!(tag.as_str(), "sh" | "bash" | "shell" | "console");
        let line = line.trim();
        let command = match line.strip_prefix("$ ") {
            Some(c) => c,
            None if shell => line,
            None => continue,
        };
        let command = command.strip_prefix("target/release/").unwrap_or(command);
        if !command.starts_with("distlock ") {
            continue;
        }
        match command.strip_suffix('\\') {
            Some(more) => pending = Some((n + 1, more.to_string())),
            None => found.push((n + 1, command.to_string())),
        }
    }
    found
}

/// A command line split into words as a shell would (quotes, a comment), up to the end of the
/// first command (`|`, `&&`, `;`, `>`).
fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                for c in chars.by_ref().take_while(|&c| c != '\'') {
                    w.push(c);
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                for c in chars.by_ref().take_while(|&c| c != '"') {
                    w.push(c);
                }
            }
            '#' if word.is_none() => break,
            '|' | ';' | '>' | '&' if word.is_none() => break,
            c if c.is_whitespace() => words.extend(word.take()),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

#[test]
fn every_command_in_the_docs_parses() {
    let mut checked = 0;
    let mut bad = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for (line, command) in commands(&text) {
            checked += 1;
            // As `main` parses: backend flags before the subcommand are taken too.
            let args = super::hoist_backend_flags(words(&command).into_iter().map(Into::into).collect());
            if let Err(e) = super::Cli::try_parse_from(args) {
                let first = e.to_string().lines().next().unwrap_or_default().to_string();
                bad.push(format!("{}:{line}: {command}\n    {first}", page.display()));
            }
        }
    }
    assert!(bad.is_empty(), "commands in the docs that this build refuses:\n{}", bad.join("\n"));
    assert!(checked >= 15, "only {checked} commands found: the scan is broken");
}

#[test]
fn words_split_as_a_shell_would() {
    assert_eq!(
        words(r#"distlock elect --value "$(hostname)" x -- ./s 'a b'  # run"#),
        ["distlock", "elect", "--value", "$(hostname)", "x", "--", "./s", "a b"]
    );
    assert_eq!(words("distlock inspect --all | head"), ["distlock", "inspect", "--all"]);
    let found = commands("```sh\ndistlock exec a \\\n  -- b\nls\n```\n```text\n$ distlock top\ndistlock x [y]\n```\n");
    assert_eq!(found, [(2, "distlock exec a -- b".to_string()), (7, "distlock top".to_string())]);
}

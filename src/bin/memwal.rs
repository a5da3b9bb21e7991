//! `memwal`: a SQL shell over one memwal root, with the look and flags of
//! `datafusion-cli` (`-c`, `-f`, `--format`, `-q`, `--maxrows`) plus
//! `--root URL`.
//!
//! Statements run through [`MemwalSession`] rather than datafusion-cli's
//! `exec_from_*`, because those hand every statement to DataFusion's planner,
//! which rejects `CREATE TABLE ... WITH (...)` before any hook of theirs
//! runs. Printing, backslash commands and line editing are datafusion-cli's.

#[path = "memwal/help.rs"]
mod help;
#[path = "memwal/print.rs"]
mod print;

use std::io::{BufRead, IsTerminal};
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::Statement as SqlStatement;
use datafusion::sql::sqlparser::dialect::{GenericDialect, dialect_from_str};
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer, TokenizerError};
use datafusion_cli::command::{Command, OutputFormat};
use datafusion_cli::helper::CliHelper;
use datafusion_cli::object_storage::instrumented::InstrumentedObjectStoreRegistry;
use datafusion_cli::print_format::PrintFormat;
use datafusion_cli::print_options::{MaxRows, PrintOptions};
use memwal::{MemwalSession, WriterOptions};
use rustyline::error::ReadlineError;

#[derive(Debug, Parser)]
#[command(name = "memwal", version, about = "SQL shell over a memwal root")]
struct Args {
    /// Root URL or path: a directory, file://, memory:// or s3://bucket/prefix
    #[arg(
        long,
        env = "MEMWAL_ROOT",
        default_value = "./memwal-data",
        global = true
    )]
    root: String,

    /// Run queries across these `memwal worker` processes (comma-separated
    /// URLs, e.g. http://h1:7001,http://h2:7001); each serves the same root
    #[arg(long, value_delimiter = ',', value_parser = worker_url)]
    workers: Vec<url::Url>,

    /// Give up on a request to an s3:// root that has not succeeded
    /// within this long, retries included (100ms, 30s, 2min)
    #[arg(
        long,
        env = "MEMWAL_STORE_TIMEOUT",
        default_value = "60s",
        value_parser = store_timeout,
        global = true
    )]
    store_timeout: std::time::Duration,

    #[command(subcommand)]
    command_kind: Option<Subcommand>,

    /// Execute the given command string(s), then exit; stops at the first
    /// failing statement with a non-zero exit code
    #[arg(short = 'c', long, num_args = 0..)]
    command: Vec<String>,

    /// Execute commands from file(s) (after any -c), then exit; stops at
    /// the first failing statement with a non-zero exit code
    #[arg(short, long, num_args = 0..)]
    file: Vec<String>,

    /// Output format [possible values: csv, tsv, table, json, nd-json (or
    /// ndjson), automatic]
    #[arg(long, default_value = "automatic", value_parser = parse_format)]
    format: PrintFormat,

    /// Reduce printing other than the results and work quietly
    #[arg(short, long)]
    quiet: bool,

    /// The max number of rows to display for 'Table' format
    /// [possible values: numbers(0/10/...), inf(no limit)]
    #[arg(long, default_value = "40")]
    maxrows: MaxRows,

    /// Enables console syntax highlighting
    #[arg(long)]
    color: bool,

    /// Set a writer option, NAME=VALUE (repeatable): durable,
    /// wal_flush_interval, memtable_bytes, load_memory_bytes, ... (see
    /// WriterOptions); sizes take KiB/MiB/GiB, durations ms/s/min. In SQL:
    /// SET memwal.NAME = 'VALUE'
    #[arg(long = "option", value_name = "NAME=VALUE")]
    options: Vec<String>,
}

#[derive(Debug, clap::Subcommand)]
enum Subcommand {
    /// Serve the tasks of queries that shells and sessions started with
    /// --workers send, over the root given by --root, until SIGINT or
    /// SIGTERM
    Worker {
        /// Address to listen on, e.g. 127.0.0.1:7001 or localhost:7001
        /// (port 0: any free port; the address is printed)
        #[arg(long, value_parser = listen_address)]
        listen: std::net::SocketAddr,
    },
}

/// datafusion-cli's format names, plus `ndjson` for `nd-json`.
fn parse_format(s: &str) -> Result<PrintFormat, String> {
    if s.eq_ignore_ascii_case("ndjson") {
        return Ok(PrintFormat::NdJson);
    }
    s.parse().map_err(|_| {
        format!("unknown format '{s}' (use csv, tsv, table, json, nd-json or automatic)")
    })
}

/// `--store-timeout`: a duration in the options' grammar.
fn store_timeout(s: &str) -> Result<std::time::Duration, String> {
    memwal::parse_duration("store-timeout", s).map_err(|e| e.to_string())
}

/// `--listen`: an IP address or a host name with a port, resolved (the
/// first address it names).
fn listen_address(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    s.to_socket_addrs()
        .map_err(|e| format!("'{s}' is no address to listen on (host:port): {e}"))?
        .next()
        .ok_or_else(|| format!("'{s}' names no address"))
}

/// A failure that ends the shell with a non-zero exit code.
type ShellResult<T = ()> = Result<T, String>;

/// Stack of the thread that plans statements and of the runtime's
/// threads (address space, used as needed): DataFusion clones and walks
/// expressions recursively, and a generated expression thousands of terms
/// long (`1 + 1 + ...`) overflows the 8 MiB a main thread gets.
const STACK_BYTES: usize = 256 << 20;

fn main() -> std::process::ExitCode {
    env_logger::init();
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(STACK_BYTES)
        .build()
        .expect("a Tokio runtime");
    let shell = std::thread::Builder::new()
        .name("memwal".into())
        .stack_size(STACK_BYTES)
        .spawn(move || {
            let result = runtime.block_on(run(args));
            // Not shut down: what is left on it is a query's tasks that
            // another library still waits for (its waits panic on a task
            // cancelled by a shutdown); everything of memwal's is closed.
            std::mem::forget(runtime);
            result
        })
        .expect("the shell's thread");
    match shell.join() {
        Ok(Ok(())) => std::process::ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("Error: {e}");
            std::process::ExitCode::FAILURE
        }
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

async fn run(args: Args) -> ShellResult {
    if let Some(Subcommand::Worker { listen }) = args.command_kind {
        return worker(&args.root, args.store_timeout, listen).await;
    }
    // The shell's user owns the machine's files: URL tables and COPY TO are
    // on (writes inside the root are refused all the same).
    let mut options = WriterOptions::default();
    for option in &args.options {
        let (name, value) = option
            .split_once('=')
            .ok_or_else(|| format!("--option takes NAME=VALUE, not '{option}'"))?;
        options.set(name.trim(), value).map_err(|e| e.to_string())?;
    }
    options.check().map_err(|e| e.to_string())?;
    let mut session = MemwalSession::builder(&args.root)
        .store_timeout(args.store_timeout)
        .allow_file_access(true)
        .writer_options(options);
    #[cfg(feature = "distributed")]
    {
        session = session.workers(args.workers.clone());
    }
    #[cfg(not(feature = "distributed"))]
    if !args.workers.is_empty() {
        return Err(NOT_DISTRIBUTED.into());
    }
    if !args.quiet {
        // A long INSERT says how far it got, once a second.
        session = session.on_insert_progress(|rows, elapsed| {
            let rate = rows as f64 / elapsed.as_secs_f64().max(1e-3);
            eprintln!(
                "INSERT: {rows} rows in {:.0} s ({rate:.0} rows/s)",
                elapsed.as_secs_f64()
            );
        });
    }
    let session = session.open().await.map_err(|e| e.to_string())?;
    // Once the URL is known to be good.
    if args.workers.len() == 1 {
        eprintln!(
            "note: with one worker, queries run in this process (a plan of one \
             task stays on the coordinator); workers take tasks from two on"
        );
    }
    let mut print_options = PrintOptions {
        format: args.format,
        quiet: args.quiet,
        maxrows: args.maxrows,
        color: args.color,
        instrumented_registry: Arc::new(InstrumentedObjectStoreRegistry::new()),
    };
    if !args.quiet {
        println!(
            "memwal {} on {}",
            env!("CARGO_PKG_VERSION"),
            session.root().url()
        );
    }
    // The interactive shell says at once when the catalog cannot be
    // loaded; with -c and -f the first statement that uses it says why
    // (loading it twice would double the wait on a store that hangs).
    let interactive = args.command.is_empty() && args.file.is_empty();
    if interactive && let Err(e) = session.catalog().await {
        let until = match e {
            // Waiting does not mend a damaged object.
            memwal::Error::Corrupt { .. } => "the damaged object is restored",
            _ => "the store answers and the catalog's newest version can be read",
        };
        eprintln!(
            "Warning: the catalog cannot be loaded ({e}); statements that use \
             memwal tables will fail until {until}"
        );
    }
    let result = async {
        for sql in &args.command {
            exec_and_print(&session, &print_options, sql)
                .await
                .map_err(|e| e.to_string())?;
        }
        for file in &args.file {
            exec_file(&session, &print_options, file).await?;
        }
        if args.command.is_empty() && args.file.is_empty() {
            if std::io::stdin().is_terminal() {
                repl(&session, &mut print_options)
                    .await
                    .map_err(|e| e.to_string())?;
            } else {
                // Input piped in is a script: one that failed must not
                // look like success (it runs on, like an interactive
                // session).
                let failed = exec_piped(&session, &mut print_options)
                    .await
                    .map_err(|e| format!("cannot read the standard input: {e}"))?;
                if failed > 0 {
                    return Err(format!("{failed} statement(s) or command(s) failed"));
                }
            }
        }
        Ok(())
    }
    .await;
    // Flush what this shell wrote (its MemTables become SSTables). Its
    // error (rows lost, say) is shown even after a failed script.
    let closed = (session.close().await)
        .map_err(|e| format!("closing the session (flushing what it wrote) failed: {e}"));
    match (result, closed) {
        (Err(script), Err(close)) => Err(format!("{close}\nError: {script}")),
        (result, closed) => result.and(closed),
    }
}

/// Runs every statement of `sql` and prints each result as datafusion-cli
/// does; stops at the first that fails.
async fn exec_and_print(
    session: &MemwalSession,
    print_options: &PrintOptions,
    sql: &str,
) -> memwal::Result<()> {
    for statement in session.parse(sql)? {
        exec_statement(session, print_options, statement).await?;
    }
    Ok(())
}

/// Runs one statement and prints its result.
async fn exec_statement(
    session: &MemwalSession,
    print_options: &PrintOptions,
    statement: DFStatement,
) -> memwal::Result<()> {
    let start = Instant::now();
    // memwal answers DESCRIBE of its tables itself (not with a
    // DescribeTable plan): it is shown whole all the same.
    let describe = matches!(
        &statement,
        DFStatement::Statement(s) if matches!(s.as_ref(), SqlStatement::ExplainTable { .. })
    );
    let df = session.execute(statement).await?;
    let mut options = print_options.clone();
    if describe
        || matches!(
            df.logical_plan(),
            LogicalPlan::Explain(_) | LogicalPlan::DescribeTable(_) | LogicalPlan::Analyze(_)
        )
    {
        options.maxrows = MaxRows::Unlimited;
    }
    if options.format == PrintFormat::Automatic {
        options.format = PrintFormat::Table;
    }
    let schema = Arc::new(df.schema().as_arrow().clone());
    let batches = df.collect().await?;
    let state = session.context().state();
    print::print_batches(
        &options,
        schema,
        &batches,
        start,
        &state.config().options().format,
    )?;
    Ok(())
}

/// Runs a SQL file statement by statement (see [`Script`]) and stops at
/// the first failing one, naming the file and the line the statement
/// starts on.
async fn exec_file(
    session: &MemwalSession,
    print_options: &PrintOptions,
    path: &str,
) -> ShellResult {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open {path}: {e}"))?;
    let mut script = Script::default();
    for line in std::io::BufReader::new(file).lines() {
        let line = line.map_err(|e| format!("cannot read {path}: {e}"))?;
        if let Some((first_line, sql)) = script.push(session, &line) {
            exec_and_print(session, print_options, &sql)
                .await
                .map_err(|e| format!("{path}:{first_line}: {e}"))?;
        }
    }
    if let Some((first_line, sql)) = script.finish() {
        exec_and_print(session, print_options, &sql)
            .await
            .map_err(|e| format!("{path}:{first_line}: {e}"))?;
    }
    Ok(())
}

/// A script read line by line, cut into whole statements: a statement
/// ends on a line whose last token (past comments) is a `;` outside any
/// string, quoted name or comment, in the session's SQL dialect. Lines
/// are kept as they are (comments and spaces too: they may be inside a
/// string), but for a first line starting with `#!`.
#[derive(Default)]
struct Script {
    text: String,
    /// Whether `text` holds more than blanks and comments.
    started: bool,
    /// Lines read so far, and the one `text` starts on (1-based).
    lines: usize,
    first_line: usize,
}

impl Script {
    /// Adds the next line; returns the statements it completes, as one
    /// text, with the line they start on.
    fn push(&mut self, session: &MemwalSession, line: &str) -> Option<(usize, String)> {
        self.lines += 1;
        if self.lines == 1 && line.starts_with("#!") {
            return None;
        }
        if self.text.is_empty() {
            self.first_line = self.lines;
        }
        self.text.push_str(line);
        self.text.push('\n');
        if !self.started {
            // Blank lines and comments before a statement are dropped: it
            // starts on the line of its first token.
            match tokens(session, &self.text) {
                Ok(tokens) if tokens.iter().all(is_blank) => {
                    self.text.clear();
                    return None;
                }
                _ => self.started = true,
            }
        }
        // Only a line with a `;` can end a statement (and the text is
        // tokenized again for each: a long statement is not, per line).
        if !line.contains(';') {
            return None;
        }
        let complete = match tokens(session, &self.text) {
            Ok(tokens) => tokens.iter().rev().find(|t| !is_blank(t)) == Some(&Token::SemiColon),
            // Text that ends inside a string, a quoted name or a comment
            // goes on on the next line; other errors are the parser's to
            // report.
            Err(e) => {
                !(e.message.contains("Unterminated") || e.message.contains("EOF"))
                    && line.trim_end().ends_with(';')
            }
        };
        complete.then(|| self.take())
    }

    /// What is left at the end of the script, unless only blanks and
    /// comments.
    fn finish(&mut self) -> Option<(usize, String)> {
        self.started.then(|| self.take())
    }

    fn take(&mut self) -> (usize, String) {
        self.started = false;
        (self.first_line, std::mem::take(&mut self.text))
    }
}

/// The tokens of `sql` in the session's SQL dialect.
fn tokens(session: &MemwalSession, sql: &str) -> Result<Vec<Token>, TokenizerError> {
    let state = session.context().state();
    let name = &state.config().options().sql_parser.dialect;
    let dialect = dialect_from_str(name).unwrap_or_else(|| Box::new(GenericDialect {}));
    Tokenizer::new(dialect.as_ref(), sql).tokenize()
}

/// Whether `token` is white space or a comment.
fn is_blank(token: &Token) -> bool {
    matches!(token, Token::Whitespace(_))
}

/// Input piped in, run as the interactive loop runs it (each statement
/// whichever fail, backslash commands too) but cut into statements as a
/// file is ([`Script`]), each run once its last line is read. Returns how
/// many statements and commands failed.
async fn exec_piped(
    session: &MemwalSession,
    print_options: &mut PrintOptions,
) -> std::io::Result<usize> {
    let mut failed = 0;
    let mut script = Script::default();
    for line in std::io::stdin().lines() {
        let line = line?;
        if !script.started && line.starts_with('\\') {
            match command_line(session, print_options, &line).await {
                None => return Ok(failed),
                Some(ok) => failed += usize::from(!ok),
            }
        } else if let Some((_, sql)) = script.push(session, &line) {
            failed += exec_each(session, print_options, &sql).await;
        }
    }
    if let Some((_, sql)) = script.finish() {
        failed += exec_each(session, print_options, &sql).await;
    }
    Ok(failed)
}

/// Runs every statement of `sql`, printing each error; returns how many
/// failed.
async fn exec_each(session: &MemwalSession, print_options: &PrintOptions, sql: &str) -> usize {
    let statements = match session.parse(sql) {
        Ok(statements) => statements,
        Err(e) => {
            eprintln!("Error: {e}");
            return 1;
        }
    };
    let mut failed = 0;
    for statement in statements {
        if let Err(e) = exec_statement(session, print_options, statement).await {
            failed += 1;
            eprintln!("Error: {e}");
        }
    }
    failed
}

/// Runs a backslash command line, printing its error: `None` for `\q`,
/// otherwise whether it succeeded.
async fn command_line(
    session: &MemwalSession,
    print_options: &mut PrintOptions,
    line: &str,
) -> Option<bool> {
    let command = line.split_whitespace().collect::<Vec<_>>().join(" ");
    match command[1..].parse::<Command>() {
        Ok(Command::Quit) => None,
        Ok(command) => match backslash(session, print_options, command).await {
            Ok(()) => Some(true),
            Err(e) => {
                eprintln!("Error: {e}");
                Some(false)
            }
        },
        Err(_) => {
            eprintln!(
                "'\\{}' is not a valid command, you can use '\\?' to see all commands",
                &line[1..]
            );
            Some(false)
        }
    }
}

/// The interactive loop: datafusion-cli's line editor, highlighter and
/// backslash commands, except those that run SQL (`\d`, `\i`), which go
/// through the memwal session, and `\h`, which also knows memwal's
/// functions. An error is printed and the loop goes on.
async fn repl(session: &MemwalSession, print_options: &mut PrintOptions) -> rustyline::Result<()> {
    let ctx = session.context();
    let dialect = ctx.state().config().options().sql_parser.dialect;
    let mut rl = rustyline::Editor::new()?;
    rl.set_helper(Some(CliHelper::new(&dialect, print_options.color)));
    rl.load_history(".history").ok();
    loop {
        match rl.readline("> ") {
            Ok(line) if line.starts_with('\\') => {
                rl.add_history_entry(line.trim_end())?;
                if command_line(session, print_options, &line).await.is_none() {
                    break;
                }
            }
            Ok(line) => {
                rl.add_history_entry(line.trim_end())?;
                // Each statement of the line runs, whichever fail.
                let statements = match session.parse(&line) {
                    Ok(statements) => statements,
                    Err(e) => {
                        eprintln!("Error: {e}");
                        continue;
                    }
                };
                for statement in statements {
                    tokio::select! {
                        res = exec_statement(session, print_options, statement) => {
                            if let Err(e) = res {
                                eprintln!("Error: {e}");
                            }
                        }
                        _ = tokio::signal::ctrl_c() => {
                            println!("^C");
                            break;
                        }
                    }
                }
            }
            Err(ReadlineError::Interrupted) => {
                println!("^C");
                continue;
            }
            Err(ReadlineError::Eof) => {
                // Ctrl-D
                println!("\\q");
                break;
            }
            Err(err) => {
                eprintln!("Unknown error happened {err:?}");
                break;
            }
        }
    }
    rl.save_history(".history")?;
    Ok(())
}

/// What `\?` lists.
const BACKSLASH_COMMANDS: [(&str, &str); 9] = [
    ("\\d", "list tables"),
    (
        "\\d name",
        "describe a table (its columns, and how to create it)",
    ),
    ("\\q", "quit memwal"),
    ("\\?", "this help"),
    ("\\i filename", "run the statements of a file"),
    ("\\h", "list functions"),
    ("\\h function", "help on a function"),
    ("\\quiet (true|false)?", "print or set quiet mode"),
    ("\\pset [format [NAME]]", "print or set the output format"),
];

/// Runs one backslash command other than `\q`.
async fn backslash(
    session: &MemwalSession,
    print_options: &mut PrintOptions,
    command: Command,
) -> ShellResult {
    match command {
        Command::Help => {
            for (command, what) in BACKSLASH_COMMANDS {
                println!("{command:<24} {what}");
            }
            Ok(())
        }
        Command::ObjectStoreProfileMode(_) => Err("\\object_store_profiling is not available: \
             memwal's tables read through memwal's own store, which it does not profile"
            .into()),
        Command::ListTables => exec_and_print(session, print_options, "SHOW TABLES")
            .await
            .map_err(|e| e.to_string()),
        Command::DescribeTableStmt(name) => {
            exec_and_print(session, print_options, &format!("DESCRIBE {name}"))
                .await
                .map_err(|e| e.to_string())?;
            // Below the columns, as psql shows indexes and options: the
            // statement that recreates the table.
            if let Ok(Some(definition)) = definition(session, &name).await {
                println!("{definition}");
            }
            Ok(())
        }
        Command::Include(Some(path)) => exec_file(session, print_options, &path).await,
        Command::SearchFunctions(name) => match help::function_help(&name) {
            Some(text) => {
                println!("{text}");
                Ok(())
            }
            None => Command::SearchFunctions(name)
                .execute(session.context(), print_options)
                .await
                .map_err(|e| e.to_string()),
        },
        Command::ListFunctions => {
            Command::ListFunctions
                .execute(session.context(), print_options)
                .await
                .map_err(|e| e.to_string())?;
            println!("memwal functions: {}", help::FUNCTIONS.join(", "));
            Ok(())
        }
        Command::OutputFormat(Some(sub)) => match sub.parse::<OutputFormat>() {
            Ok(format) => format.execute(print_options).map_err(|e| e.to_string()),
            Err(_) => Err(format!("'\\pset {sub}' is not a valid command")),
        },
        Command::OutputFormat(None) => {
            println!("Output format is {:?}.", print_options.format);
            Ok(())
        }
        other => other
            .execute(session.context(), print_options)
            .await
            .map_err(|e| e.to_string()),
    }
}

/// The `CREATE TABLE` statement of memwal table `name`, if it is one.
async fn definition(session: &MemwalSession, name: &str) -> memwal::Result<Option<String>> {
    use datafusion::arrow::array::AsArray;
    let batches = session
        .sql(&format!("SHOW CREATE TABLE {name}"))
        .await?
        .collect()
        .await?;
    Ok(batches
        .first()
        .and_then(|b| b.column_by_name("definition"))
        .filter(|c| !c.is_empty() && !c.is_null(0))
        .map(|c| c.as_string::<i32>().value(0).to_string()))
}

/// Parses a `--workers` URL, saying what one looks like when it is none
/// (`127.0.0.1:7001` without its `http://`, say).
fn worker_url(text: &str) -> Result<url::Url, String> {
    url::Url::parse(text).map_err(|e| format!("{e}: a worker URL is http://host:port"))
}

/// Why --workers and `memwal worker` fail in a build without them.
#[cfg(not(feature = "distributed"))]
const NOT_DISTRIBUTED: &str = "this memwal was built without the `distributed` feature";

#[cfg(not(feature = "distributed"))]
async fn worker(_: &str, _: std::time::Duration, _: std::net::SocketAddr) -> ShellResult {
    Err(NOT_DISTRIBUTED.into())
}

/// `memwal worker`: serves query tasks over `root` on `listen` until
/// SIGINT or SIGTERM.
#[cfg(feature = "distributed")]
async fn worker(
    root: &str,
    store_timeout: std::time::Duration,
    listen: std::net::SocketAddr,
) -> ShellResult {
    let root =
        memwal::ObjectRoot::open_with_timeout(root, store_timeout).map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    println!("memwal worker on http://{address} serving {}", root.url());
    let stop = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    memwal::sql::distributed::serve_worker(root, listener, stop)
        .await
        .map_err(|e| e.to_string())
}

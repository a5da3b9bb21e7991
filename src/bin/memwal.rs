//! `memwal`: a SQL shell over one memwal root, with the look and flags of
//! `datafusion-cli` (`-c`, `-f`, `--format`, `-q`, `--maxrows`) plus
//! `--root URL`.
//!
//! Statements run through [`MemwalSession`] rather than datafusion-cli's
//! `exec_from_*`, because those hand every statement to DataFusion's planner,
//! which rejects `CREATE TABLE ... WITH (...)` before any hook of theirs
//! runs. Printing, backslash commands and line editing are datafusion-cli's.

use std::io::BufRead;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use datafusion::logical_expr::LogicalPlan;
use datafusion_cli::command::{Command, OutputFormat};
use datafusion_cli::helper::CliHelper;
use datafusion_cli::object_storage::instrumented::InstrumentedObjectStoreRegistry;
use datafusion_cli::print_format::PrintFormat;
use datafusion_cli::print_options::{MaxRows, PrintOptions};
use memwal::MemwalSession;
use rustyline::error::ReadlineError;

#[derive(Debug, Parser)]
#[command(name = "memwal", version, about = "SQL shell over a memwal root")]
struct Args {
    /// Root URL or path: a directory, file://, memory:// or s3://bucket/prefix
    #[arg(long, env = "MEMWAL_ROOT", default_value = "./memwal-data")]
    root: String,

    /// Execute the given command string(s), then exit
    #[arg(short = 'c', long, num_args = 0..)]
    command: Vec<String>,

    /// Execute commands from file(s), then exit
    #[arg(short, long, num_args = 0..)]
    file: Vec<String>,

    #[arg(long, value_enum, default_value_t = PrintFormat::Automatic)]
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
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    env_logger::init();
    let args = Args::parse();
    match run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> memwal::Result<()> {
    // The shell's user owns the machine's files: URL tables and COPY TO are
    // on (writes inside the root are refused all the same).
    let session = MemwalSession::builder(&args.root)
        .allow_file_access(true)
        .open()
        .await?;
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
    let result = async {
        if !args.command.is_empty() {
            for sql in &args.command {
                exec_and_print(&session, &print_options, sql).await?;
            }
        } else if !args.file.is_empty() {
            for file in &args.file {
                exec_file(&session, &print_options, file).await?;
            }
        } else {
            repl(&session, &mut print_options)
                .await
                .map_err(|e| memwal::Error::Io(std::io::Error::other(e)))?;
        }
        Ok(())
    }
    .await;
    // Flush what this shell wrote (its MemTables become SSTables).
    let closed = session.close().await;
    result.and(closed)
}

/// Runs every statement of `sql` and prints each result as datafusion-cli
/// does.
async fn exec_and_print(
    session: &MemwalSession,
    print_options: &PrintOptions,
    sql: &str,
) -> memwal::Result<()> {
    for statement in session.parse(sql)? {
        let start = Instant::now();
        let df = session.execute(statement).await?;
        let mut options = print_options.clone();
        if matches!(
            df.logical_plan(),
            LogicalPlan::Explain(_) | LogicalPlan::DescribeTable(_) | LogicalPlan::Analyze(_)
        ) {
            options.maxrows = MaxRows::Unlimited;
        }
        if options.format == PrintFormat::Automatic {
            options.format = PrintFormat::Table;
        }
        let schema = Arc::new(df.schema().as_arrow().clone());
        let batches = df.collect().await?;
        let rows = batches.iter().map(|b| b.num_rows()).sum();
        let state = session.context().state();
        options.print_batches(
            schema,
            &batches,
            start,
            rows,
            &state.config().options().format,
        )?;
    }
    Ok(())
}

/// Runs a SQL file statement by statement (a statement ends with a line
/// ending in `;`); like datafusion-cli, an error is printed and the file
/// goes on.
async fn exec_file(
    session: &MemwalSession,
    print_options: &PrintOptions,
    path: &str,
) -> memwal::Result<()> {
    let file = std::fs::File::open(path)
        .map_err(|e| memwal::Error::invalid(format!("cannot open {path}: {e}")))?;
    let mut query = String::new();
    for line in std::io::BufReader::new(file).lines() {
        let line = line?;
        if line.starts_with("--") || line.starts_with("#!") {
            continue;
        }
        let line = line.trim_end();
        query.push_str(line);
        query.push('\n');
        if line.ends_with(';') {
            if let Err(e) = exec_and_print(session, print_options, &query).await {
                eprintln!("{e}");
            }
            query.clear();
        }
    }
    if query.trim().is_empty() {
        Ok(())
    } else {
        exec_and_print(session, print_options, &query).await
    }
}

/// The interactive loop: datafusion-cli's line editor, highlighter and
/// backslash commands.
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
                let command = line.split_whitespace().collect::<Vec<_>>().join(" ");
                match command[1..].parse::<Command>() {
                    Ok(Command::Quit) => break,
                    Ok(Command::OutputFormat(Some(sub))) => match sub.parse::<OutputFormat>() {
                        Ok(format) => {
                            if let Err(e) = format.execute(print_options) {
                                eprintln!("{e}");
                            }
                        }
                        Err(_) => eprintln!("'\\{}' is not a valid command", &line[1..]),
                    },
                    Ok(Command::OutputFormat(None)) => {
                        println!("Output format is {:?}.", print_options.format)
                    }
                    Ok(cmd) => {
                        if let Err(e) = cmd.execute(ctx, print_options).await {
                            eprintln!("{e}");
                        }
                    }
                    Err(_) => eprintln!(
                        "'\\{}' is not a valid command, you can use '\\?' to see all commands",
                        &line[1..]
                    ),
                }
            }
            Ok(line) => {
                rl.add_history_entry(line.trim_end())?;
                tokio::select! {
                    res = exec_and_print(session, print_options, &line) => {
                        if let Err(e) = res {
                            eprintln!("{e}");
                        }
                    }
                    _ = tokio::signal::ctrl_c() => println!("^C"),
                }
            }
            Err(ReadlineError::Interrupted) => {
                println!("^C");
                continue;
            }
            Err(ReadlineError::Eof) => {
                println!("\\q");
                break;
            }
            Err(err) => {
                eprintln!("Unknown error happened {err:?}");
                break;
            }
        }
    }
    rl.save_history(".history")
}

use std::process::ExitCode;

use clap::Parser as _;
use inventory_server::{
    config::{Cli, Command, Settings, parse_database_url},
    startup::{Application, shutdown_signal},
    telemetry,
};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.log.log_format);
    match run(cli.command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            eprintln!("inventory-server: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(args) => {
            let settings = Settings::from_args(&args)?;
            let application = Application::build(settings).await?;
            application.run_until_stopped(shutdown_signal()).await
        }
        Command::Migrate(args) => {
            let config = parse_database_url(&args.database_url).map_err(anyhow::Error::msg)?;
            let applied = inventory_postgres::migrate::run(&config).await?;
            if applied.is_empty() {
                tracing::info!("schema is up to date");
            } else {
                tracing::info!(?applied, "migrations applied");
            }
            Ok(())
        }
    }
}

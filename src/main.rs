use std::process::ExitCode;

use clap::Parser as _;
use inventory_postgres::Schema;
use inventory_server::{
    auth,
    config::{Cli, Command, Settings, parse_database_url},
    startup::{Application, shutdown_signal},
    telemetry,
};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let telemetry =
        match telemetry::init(cli.log.log_format, &telemetry::TelemetrySettings::default()) {
            Ok(telemetry) => telemetry,
            Err(error) => {
                eprintln!("inventory-server: cannot set up telemetry: {error:#}");
                return ExitCode::FAILURE;
            }
        };
    let result = run(cli.command, telemetry.registry().clone()).await;
    // Flushing blocks while the exporters need the runtime: off the async threads.
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            eprintln!("inventory-server: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command, registry: prometheus::Registry) -> anyhow::Result<()> {
    match command {
        Command::Serve(args) => {
            let settings = Settings::from_args(&args)?;
            let application = Application::build_with_registry(settings, registry).await?;
            application.run_until_stopped(shutdown_signal()).await
        }
        Command::Relay(args) => {
            inventory_server::relay::serve(&args, registry, shutdown_signal()).await
        }
        Command::HashToken { certificate } => {
            let mut input = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut input)?;
            let line = if certificate {
                use rustls_pki_types::{CertificateDer, pem::PemObject as _};
                let der = CertificateDer::from_pem_slice(&input)
                    .map_err(|error| anyhow::anyhow!("stdin is not a PEM certificate: {error}"))?;
                format!("cert-sha256:{}", auth::digest_hex(der.as_ref()))
            } else {
                let token = String::from_utf8(input)?;
                let token = token.trim_end_matches(['\r', '\n']);
                anyhow::ensure!(!token.is_empty(), "stdin holds no token");
                format!("token-sha256:{}", auth::digest_hex(token.as_bytes()))
            };
            println!("{line}");
            Ok(())
        }
        Command::Verify(args) => {
            let config = parse_database_url(&args.database_url).map_err(anyhow::Error::msg)?;
            let mut drifts = 0;
            for tenant in args.tenant_list()? {
                drifts += verify_tenant(&config, &tenant).await?;
            }
            anyhow::ensure!(
                drifts == 0,
                "{drifts} drift(s) between the stock rows, the ledger and the live holds"
            );
            Ok(())
        }
        Command::NewStreamEpoch { database, reason } => {
            let config = parse_database_url(&database.database_url).map_err(anyhow::Error::msg)?;
            for tenant in database.tenant_list()? {
                let config = config.clone().in_schema(Schema::of_tenant(&tenant));
                let (mut client, connection) = config.open().await?;
                let driver = tokio::spawn(connection);
                config.enter_schema(&client).await?;
                let epoch =
                    inventory_postgres::events::new_stream_epoch(&mut client, &reason).await?;
                drop(client);
                let _ = driver.await;
                println!(
                    "tenant {tenant}: new stream epoch {} after position {}",
                    epoch.id, epoch.starts_after
                );
            }
            Ok(())
        }
        Command::Migrate(args) => {
            let config = parse_database_url(&args.database_url).map_err(anyhow::Error::msg)?;
            for tenant in args.tenant_list()? {
                let schema = Schema::of_tenant(&tenant);
                let applied =
                    inventory_postgres::migrate::run(&config.clone().in_schema(schema.clone()))
                        .await?;
                if applied.is_empty() {
                    tracing::info!(%tenant, %schema, "schema is up to date");
                } else {
                    tracing::info!(%tenant, %schema, ?applied, "migrations applied");
                }
            }
            Ok(())
        }
    }
}

/// `verify` of one tenant's schema: prints each drift, returns how many.
async fn verify_tenant(
    config: &inventory_postgres::PgConfig,
    tenant: &inventory_core::domain::Tenant,
) -> anyhow::Result<usize> {
    // Through the store's upkeep port, on one connection.
    let settings = inventory_postgres::PoolSettings {
        max_size: 1,
        ..Default::default()
    };
    let pool = inventory_postgres::connect(
        config.clone().in_schema(Schema::of_tenant(tenant)),
        &settings,
    )?;
    let store =
        inventory_postgres::PgStore::new(pool, settings.operation_bound()).for_tenant(tenant);
    let started = std::time::Instant::now();
    let report = inventory_core::ports::Upkeep::verify(&store).await?;
    for drift in &report.drifts {
        println!("drift {drift}");
    }
    // Exported over OTLP when configured (flushed on exit), so a scheduled run can be
    // alerted on: inventory_verify_drift > 0.
    opentelemetry::global::meter("inventory-server")
        .u64_gauge("inventory.verify.drift")
        .with_description(
            "Drifts the last verify run found between the stock rows, the ledger and the live holds",
        )
        .build()
        .record(
            report.drifts.len() as u64,
            &[opentelemetry::KeyValue::new("tenant", tenant.as_str().to_owned())],
        );
    let tenant_note = if tenant.is_default() {
        String::new()
    } else {
        format!("tenant {tenant}: ")
    };
    println!(
        "{tenant_note}verified {} SKUs and {} movements in {:.3} s: {} drift(s)",
        report.skus,
        report.movements,
        started.elapsed().as_secs_f64(),
        report.drifts.len()
    );
    Ok(report.drifts.len())
}

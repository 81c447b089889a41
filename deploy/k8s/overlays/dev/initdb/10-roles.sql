-- The database roles of inventory-server: one per command, each with only what it needs.
--
--   inventory_migrator  `inventory-server migrate` (the pods' migrate initContainer). Creates
--                       the tables, indexes and functions in schema public and owns them: the
--                       only role that may change the schema.
--   inventory_server    `inventory-server serve`. Reads and writes rows (SELECT, INSERT,
--                       UPDATE, DELETE), uses sequences, calls the schema's functions. It
--                       owns nothing and cannot CREATE, ALTER, DROP or TRUNCATE anything,
--                       nor create temporary tables.
--   inventory_verifier  `inventory-server verify` (the daily CronJob). SELECT only: verify
--                       reads one read-only snapshot.
--
-- The serving path needs nothing else: every statement it sends is DML, advisory locks,
-- LISTEN/NOTIFY, session settings (SET) and functions PostgreSQL grants to everyone
-- (pg_logical_emit_message, pg_control_system, pg_current_wal_lsn). tests/api/roles.rs
-- applies this script to a new database, migrates as inventory_migrator, serves as
-- inventory_server and verifies as inventory_verifier.
--
-- Run it as a superuser (on a managed service: its administrator role, which must be a
-- member of inventory_migrator for the ALTER DEFAULT PRIVILEGES below), connected to the
-- service's database, before the first `migrate`:
--
--   psql -v ON_ERROR_STOP=1 -d inventory -f deploy/sql/roles.sql
--
-- then give each role a password and put it in that role's Secret (docs/operations.md,
-- "Deploy to production"):
--
--   ALTER ROLE inventory_migrator PASSWORD '...';
--   ALTER ROLE inventory_server PASSWORD '...';
--   ALTER ROLE inventory_verifier PASSWORD '...';
--
-- It may be run again at any time (it creates only what is missing and grants again). Tables,
-- sequences and functions a later migration adds are granted by the default privileges
-- below, as inventory_migrator creates them: nothing to run after an upgrade. The tables
-- that record the schema's state (refinery_schema_history, schema_floor) are the exception:
-- `migrate` itself takes back every write on them but its own, each time it runs, so
-- inventory_server only reads them and a serving credential cannot lower the schema floor.
--
-- A database that one role both migrated and served from (the single `inventory` user of
-- earlier releases) moves its objects to the migrating role first, in that database:
--
--   REASSIGN OWNED BY inventory TO inventory_migrator;
--
-- then runs this script, switches the Secrets, and drops or disables the old user.

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'inventory_migrator') THEN
        CREATE ROLE inventory_migrator LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'inventory_server') THEN
        CREATE ROLE inventory_server LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'inventory_verifier') THEN
        CREATE ROLE inventory_verifier LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION;
    END IF;
END
$$;

-- The database: every role may connect; nobody else's default right to create temporary
-- tables in it remains (the service never uses them).
DO $$
BEGIN
    EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
    EXECUTE format(
        'GRANT CONNECT ON DATABASE %I TO inventory_migrator, inventory_server, inventory_verifier',
        current_database());
END
$$;

-- Tenants other than `default` live in schemas of their own (`tenant_<name>`), which
-- `migrate` creates: the migrating role may create schemas in this database, and gives each
-- new schema the USAGE grants of public.
DO $$
BEGIN
    EXECUTE format('GRANT CREATE ON DATABASE %I TO inventory_migrator', current_database());
END
$$;

-- The schema: only the migrating role creates objects in it. PostgreSQL 15 and later revoke
-- CREATE from PUBLIC themselves; earlier versions grant it to every role.
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE, CREATE ON SCHEMA public TO inventory_migrator;
GRANT USAGE ON SCHEMA public TO inventory_server, inventory_verifier;

-- Objects that exist already (a database migrated before this script ran, or run again).
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO inventory_server;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO inventory_server;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO inventory_server;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO inventory_verifier;

-- The schema's own records are the migrator's to write: the server reads them (readiness),
-- never writes them. They exist once the first `migrate` has run.
DO $$
BEGIN
    IF to_regclass('public.refinery_schema_history') IS NOT NULL THEN
        REVOKE INSERT, UPDATE, DELETE ON public.refinery_schema_history FROM inventory_server;
    END IF;
    IF to_regclass('public.schema_floor') IS NOT NULL THEN
        REVOKE INSERT, UPDATE, DELETE ON public.schema_floor FROM inventory_server;
    END IF;
END
$$;

-- Objects inventory_migrator creates from now on, in every schema (a tenant's too): every
-- later migration's tables as well.
ALTER DEFAULT PRIVILEGES FOR ROLE inventory_migrator
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO inventory_server;
ALTER DEFAULT PRIVILEGES FOR ROLE inventory_migrator
    GRANT USAGE, SELECT ON SEQUENCES TO inventory_server;
ALTER DEFAULT PRIVILEGES FOR ROLE inventory_migrator
    GRANT SELECT ON TABLES TO inventory_verifier;

-- Objects inventory_migrator creates from now on: every later migration's tables too.
ALTER DEFAULT PRIVILEGES FOR ROLE inventory_migrator IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO inventory_server;
ALTER DEFAULT PRIVILEGES FOR ROLE inventory_migrator IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO inventory_server;
ALTER DEFAULT PRIVILEGES FOR ROLE inventory_migrator IN SCHEMA public
    GRANT EXECUTE ON FUNCTIONS TO inventory_server;
ALTER DEFAULT PRIVILEGES FOR ROLE inventory_migrator IN SCHEMA public
    GRANT SELECT ON TABLES TO inventory_verifier;

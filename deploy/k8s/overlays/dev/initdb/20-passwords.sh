# Run by the postgres image on its first start, after 10-roles.sql (a copy of
# deploy/sql/roles.sql): gives the service's roles the passwords of the dev Secrets' URLs.
psql -v ON_ERROR_STOP=1 --no-psqlrc --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v migrator="$INVENTORY_MIGRATOR_PASSWORD" \
  -v server="$INVENTORY_SERVER_PASSWORD" \
  -v verifier="$INVENTORY_VERIFIER_PASSWORD" <<'SQL'
ALTER ROLE inventory_migrator PASSWORD :'migrator';
ALTER ROLE inventory_server PASSWORD :'server';
ALTER ROLE inventory_verifier PASSWORD :'verifier';
SQL

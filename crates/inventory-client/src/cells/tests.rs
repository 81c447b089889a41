use super::*;
use crate::TlsOptions;

const MAP: &str = "\
# cell  endpoint                      tenants
c1      https://inventory-c1:50051    default brand_a

c2\thttps://inventory-c2:50051\tbrand_b marketplace   # moved from c1
";

/// The problems of a map that must be refused.
fn problems(text: &str) -> Vec<CellMapProblem> {
    match CellMap::parse(text) {
        Err(CellMapError::Invalid { path, problems }) => {
            assert_eq!(path, None);
            problems
        }
        other => panic!("expected an invalid map, got {other:?}"),
    }
}

fn lines(problems: &[CellMapProblem]) -> Vec<Option<usize>> {
    problems.iter().map(|p| p.line).collect()
}

#[test]
fn a_good_map_is_read_with_its_comments_and_blank_lines_skipped() {
    let map = CellMap::parse(MAP).unwrap();
    let cells = map.cells();
    assert_eq!(cells.len(), 2);
    assert_eq!(cells[0].name(), "c1");
    assert_eq!(cells[0].endpoint(), "https://inventory-c1:50051");
    assert_eq!(cells[0].tenants(), ["default", "brand_a"]);
    assert_eq!(cells[1].name(), "c2");
    assert_eq!(cells[1].endpoint(), "https://inventory-c2:50051");
    assert_eq!(cells[1].tenants(), ["brand_b", "marketplace"]);
    assert_eq!(MAP.parse::<CellMap>().unwrap(), map);
}

#[test]
fn each_tenant_is_found_in_its_cell() {
    let map = CellMap::parse(MAP).unwrap();
    assert_eq!(map.cell_of("default").unwrap().name(), "c1");
    assert_eq!(map.cell_of("brand_a").unwrap().name(), "c1");
    assert_eq!(map.cell_of("brand_b").unwrap().name(), "c2");
    assert_eq!(map.cell_of("marketplace").unwrap().name(), "c2");
    assert_eq!(map.cell_of("brand_c"), None);
    assert_eq!(map.cell_of("c1"), None, "a cell is not a tenant");
    assert_eq!(map.cell_of(""), None);
    assert_eq!(
        map.cell("c2").unwrap().tenants(),
        ["brand_b", "marketplace"]
    );
    assert_eq!(map.cell("c3"), None);
}

#[test]
fn names_at_the_edges_of_their_rules() {
    let longest_cell = format!("0{}", "-".repeat(62));
    let longest_tenant = format!("a{}", "_".repeat(30));
    let map = CellMap::parse(&format!(
        "{longest_cell} http://10.0.0.1:50051 {longest_tenant} z t0\n"
    ))
    .unwrap();
    assert_eq!(map.cell_of(&longest_tenant).unwrap().name(), longest_cell);
    assert_eq!(
        map.cell_of("z").unwrap().endpoint(),
        "http://10.0.0.1:50051"
    );

    let problems = problems(&format!(
        "{longest_cell}x http://h:1 a\nc http://h:1 {longest_tenant}x\n"
    ));
    assert_eq!(lines(&problems), [Some(1), Some(2)], "{problems:?}");
}

#[test]
fn bad_cell_names_are_refused() {
    for name in ["C1", "-c1", "_c1", "c.1", "cé"] {
        let problems = problems(&format!("{name} http://h:1 a\n"));
        assert_eq!(lines(&problems), [Some(1)], "{name}: {problems:?}");
        assert!(problems[0].message.contains("cell name"), "{problems:?}");
    }
}

#[test]
fn bad_tenant_names_are_refused() {
    for tenant in ["Brand", "1brand", "_brand", "brand-a", "brand.a", "brandé"] {
        let problems = problems(&format!("c1 http://h:1 {tenant}\n"));
        assert_eq!(lines(&problems), [Some(1)], "{tenant}: {problems:?}");
        assert!(problems[0].message.contains("tenant name"), "{problems:?}");
        assert!(problems[0].message.contains(tenant), "{problems:?}");
    }
}

#[test]
fn endpoints_must_be_http_or_https_uris() {
    for endpoint in ["inventory-c1:50051", "grpc://h:1", "ftp://h", "HTTP://h:1"] {
        let problems = problems(&format!("c1 {endpoint} a\n"));
        assert_eq!(lines(&problems), [Some(1)], "{endpoint}: {problems:?}");
        assert!(
            problems[0].message.contains("http:// or https://"),
            "{problems:?}"
        );
    }
    for (endpoint, what) in [
        ("http://", "not a valid URI"),
        ("https://[::1:50051", "not a valid URI"),
        ("http://h:port", "port that is not a number"),
        ("http://:50051", "no host"),
    ] {
        let problems = problems(&format!("c1 {endpoint} a\n"));
        assert_eq!(lines(&problems), [Some(1)], "{endpoint}: {problems:?}");
        assert!(
            problems[0].message.contains(what),
            "{endpoint}: {problems:?}"
        );
    }
}

#[test]
fn a_tenant_is_in_one_cell_only() {
    let problems = problems(
        "c1 http://a:1 default brand_a\nc2 http://b:1 brand_b default\nc3 http://c:1 x x\n",
    );
    assert_eq!(lines(&problems), [Some(2), Some(3)], "{problems:?}");
    assert_eq!(
        problems[0].message,
        r#"tenant "default" is already in cell "c1" (line 1)"#
    );
    assert_eq!(
        problems[1].message,
        r#"tenant "x" is already in cell "c3" (line 3)"#
    );
}

#[test]
fn cell_names_are_unique() {
    let problems = problems("c1 http://a:1 x\nc2 http://b:1 y\nc1 http://c:1 z\n");
    assert_eq!(lines(&problems), [Some(3)], "{problems:?}");
    assert_eq!(
        problems[0].message,
        r#"cell "c1" is already defined on line 1"#
    );
}

#[test]
fn a_cell_needs_tenants() {
    let problems = problems("c1 http://a:1 x\nc2 http://b:1 # none yet\nc3\n");
    assert_eq!(lines(&problems), [Some(2), Some(3)], "{problems:?}");
    assert_eq!(problems[0].message, r#"cell "c2" has no tenant"#);
    assert!(problems[1].message.contains("no endpoint"), "{problems:?}");
}

#[test]
fn an_empty_map_is_refused() {
    for text in ["", "\n\n", "# cell endpoint tenants\n   \n\t# nothing\n"] {
        let problems = problems(text);
        assert_eq!(lines(&problems), [None], "{text:?}: {problems:?}");
        assert_eq!(problems[0].message, "the map names no cell");
    }
}

#[test]
fn every_problem_is_reported_with_its_line() {
    let text = "\
# a map with something wrong on most lines
c1 http://a:1 default Brand_A
C2 ftp://b x
c1 http://c:1 default
ok https://d:1 fine
";
    let error = CellMap::parse(text).unwrap_err();
    let problems = error.problems();
    assert_eq!(
        lines(problems),
        [Some(2), Some(3), Some(3), Some(4), Some(4)],
        "{problems:?}"
    );
    let message = error.to_string();
    assert!(
        message.starts_with("invalid cell map: line 2: tenant name \"Brand_A\""),
        "{message}"
    );
    assert!(message.contains("; line 3: cell name \"C2\""), "{message}");
    assert!(
        message.contains("; line 4: tenant \"default\" is already in cell \"c1\" (line 2)"),
        "{message}"
    );
}

#[test]
fn a_file_is_read_and_its_path_named_in_errors() {
    let dir = std::env::temp_dir().join(format!("cells-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir(&dir).unwrap();
    let good = dir.join("good");
    std::fs::write(&good, MAP).unwrap();
    assert_eq!(
        CellMap::from_file(&good).unwrap(),
        CellMap::parse(MAP).unwrap()
    );

    let bad = dir.join("bad");
    std::fs::write(&bad, "c1 http://a:1\n").unwrap();
    let error = CellMap::from_file(&bad).unwrap_err();
    assert!(
        matches!(&error, CellMapError::Invalid { path: Some(path), .. } if *path == bad),
        "{error:?}"
    );
    assert!(
        error.to_string().contains(&bad.display().to_string()),
        "{error}"
    );

    let missing = dir.join("missing");
    let error = CellMap::from_file(&missing).unwrap_err();
    assert!(
        matches!(&error, CellMapError::Read { path, .. } if *path == missing),
        "{error:?}"
    );
    assert!(error.problems().is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn each_tenant_gets_its_cells_client() {
    let map =
        CellMap::parse("c1 http://127.0.0.1:1 default brand_a\nc2 http://127.0.0.1:2 b\n").unwrap();
    let mut base = ClientConfig::new("http://ignored:9");
    base.token = Some("s3cret".into());
    let cells = CellClients::new(map, &base).unwrap();
    assert!(cells.for_tenant("default").is_ok());
    assert!(cells.for_tenant("b").is_ok());
    assert!(cells.for_cell("c2").is_some());
    assert!(cells.for_cell("c3").is_none());
    assert_eq!(cells.map().cells().len(), 2);
    match cells.for_tenant("brand_c") {
        Err(Error::UnknownTenant { tenant }) => assert_eq!(tenant, "brand_c"),
        other => panic!("expected UnknownTenant, got {other:?}"),
    }
}

#[tokio::test]
async fn a_cell_the_config_cannot_reach_is_named() {
    let map = CellMap::parse("c1 https://127.0.0.1:1 a\nc2 http://127.0.0.1:2 b\n").unwrap();
    // TLS fits c1's https:// endpoint but not c2's http:// one.
    let mut base = ClientConfig::new("https://ignored:9");
    base.tls = Some(TlsOptions::default());
    match CellClients::new(map.clone(), &base) {
        Err(Error::Invalid { message, .. }) => {
            assert!(message.starts_with("cell \"c2\": "), "{message}")
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    // Without TLS, c1's https:// endpoint is refused.
    match CellClients::new(map, &ClientConfig::default()) {
        Err(Error::Invalid { message, .. }) => {
            assert!(message.starts_with("cell \"c1\": "), "{message}")
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
}
